/*
 * utf8.c — one UTF-8 validator for everything that reads names and strings
 * from files: the strict JSON check (as serde_json reads it), the GGUF and
 * safetensors readers, and the escaping of names for a terminal
 * (mlo_escape).  It sits on the ground floor because all of them use it.
 */
#include "base/utf8.h"

#include <stdint.h>

size_t mlo_utf8_seq_len(const unsigned char *s, size_t len) {
  if (!len) return 0;
  unsigned char b = s[0];
  if (b < 0x80) return b ? 1 : 0;
  size_t n;
  uint32_t cp;
  if (b >= 0xC2 && b <= 0xDF)
    n = 1, cp = b & 0x1F;
  else if (b >= 0xE0 && b <= 0xEF)
    n = 2, cp = b & 0x0F;
  else if (b >= 0xF0 && b <= 0xF4)
    n = 3, cp = b & 0x07;
  else
    return 0;
  if (len <= n) return 0;
  for (size_t k = 1; k <= n; k++) {
    if ((s[k] & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (s[k] & 0x3F);
  }
  /* overlong forms, UTF-16 surrogates, past U+10FFFF */
  if ((n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10FFFF ||
      (cp >= 0xD800 && cp <= 0xDFFF))
    return 0;
  return n + 1;
}
