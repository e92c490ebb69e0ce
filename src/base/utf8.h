/*
 * utf8.h — the length of one well-formed UTF-8 sequence (utf8.c).
 */
#ifndef MLO_BASE_UTF8_H
#define MLO_BASE_UTF8_H

#include <stddef.h>

/* The length (1..4) of the well-formed UTF-8 sequence at s, of at most len
 * bytes; 0 if it is not one: a NUL, a stray continuation byte, a truncated
 * sequence, an overlong form, a UTF-16 surrogate or past U+10FFFF. */
size_t mlo_utf8_seq_len(const unsigned char *s, size_t len);

#endif
