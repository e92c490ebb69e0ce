/*
 * json.h — JSON as the reference implementation reads it.
 *
 * cJSON is a tolerant parser (a byte-order mark, control characters in
 * strings, "01", "1.0" where an integer belongs all pass), and it keeps
 * both copies of a repeated key.  Checkpoints and their indexes are hostile
 * input that other tools read with serde_json (safetensors) or Python's
 * json module (diffusers), so mlo reads what they read and refuses what they
 * refuse: the text is first checked against the strict grammar below, then
 * handed to cJSON for the tree.  docs/formats.md writes the grammar out.
 */
#ifndef MLO_FORMAT_JSON_H
#define MLO_FORMAT_JSON_H

#include <cjson/cJSON.h>
#include <stddef.h>

enum {
  /* shape and data_offsets of a safetensors header's tensor entries hold
   * unsigned integers written as such (no sign, fraction or exponent), as
   * serde reads them into usize */
  MLO_JSON_ST_INTEGERS = 1u << 0,
  /* leave repeated keys to the caller (the safetensors reader names them
   * in its own words: a tensor listed twice, a field given twice) */
  MLO_JSON_KEEP_DUPLICATES = 1u << 1,
};

/* The strict grammar (RFC 8259 as serde_json applies it): whitespace is
 * space, tab, LF, CR only; strings hold no byte below 0x20, only the eight
 * short escapes and \uXXXX with surrogates paired; numbers have no leading
 * zeros or plus sign; nesting is at most 127 levels; nothing but whitespace
 * follows the value.  And, where mlo is stricter than the reference because
 * its names are C strings and must mean one thing: no \u0000 in any string,
 * no key twice in one object.  Returns 0, or MLO_EFORMAT with *at the byte
 * offset and why a short reason. */
int mlo_json_check(const char *text, size_t len, unsigned flags, size_t *at, char *why,
                   size_t whylen);

/* Checks then parses.  name (a path, for messages) and what (the file's
 * part, may be NULL) make err "NAME: WHAT: not valid JSON at byte N: why".
 * MLO_ENOMEM when an allocation failed, MLO_EFORMAT for bad text. */
int mlo_json_parse(const char *name, const char *what, const char *text, size_t len, unsigned flags,
                   cJSON **out, char *err, size_t errlen);

/* Reads a small regular file (at most cap bytes) and parses it as above:
 * the one way model_index.json, weight maps, config.json and the
 * generator's stamp are read.  Messages name the path. */
int mlo_json_read_file(const char *path, size_t cap, unsigned flags, cJSON **out, char *err,
                       size_t errlen);

#endif
