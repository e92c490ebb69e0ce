/*
 * json.c — the strict JSON check in front of cJSON (json.h says why).
 *
 * A single recursive-descent pass over the bytes, no allocation: it only
 * decides whether the text is one the reference would read, and where it
 * first is not.  Keys are compared for duplicates on the tree cJSON builds
 * afterwards (sorted per object, so a hostile header costs n log n).
 */
#include "format/json.h"

#include "base/utf8.h"

#include "base/log.h"
#include "base/sysio.h"
#include "mlo/mlo.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 127 /* serde_json's recursion limit: 128 levels fail */

/* What the value being scanned is, for the safetensors integer rule. */
typedef enum { CTX_ANY, CTX_ROOT, CTX_ENTRY, CTX_UINTS } scan_ctx;

typedef struct {
  const unsigned char *s;
  size_t len, pos;
  unsigned flags;
  int depth;
  const char *why;
  char entry[96];  /* ST_INTEGERS: the tensor entry being scanned */
  char number[32]; /* the number a rule refused, for the message */
} scanner;

static bool fail(scanner *sc, const char *why) {
  sc->why = why;
  return false;
}

static void skip_ws(scanner *sc) {
  while (sc->pos < sc->len) {
    unsigned char c = sc->s[sc->pos];
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
    sc->pos++;
  }
}

static int peek(const scanner *sc) {
  return sc->pos < sc->len ? sc->s[sc->pos] : -1;
}

static int hex4(scanner *sc) {
  if (sc->len - sc->pos < 4) return -1;
  int v = 0;
  for (int i = 0; i < 4; i++) {
    unsigned char c = sc->s[sc->pos + (size_t)i];
    int d = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                   : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  sc->pos += 4;
  return v;
}

/* One UTF-8 sequence starting at pos (a lead byte >= 0x80). */
static bool utf8_seq(scanner *sc) {
  size_t bad = mlo_utf8_seq_len(sc->s + sc->pos, sc->len - sc->pos);
  if (bad == 0) return fail(sc, "invalid UTF-8 in a string");
  sc->pos += bad;
  return true;
}

/* A string; the decoded text's first keycap-1 bytes go to key (NUL-ended),
 * its decoded length to *keylen. */
static bool scan_string(scanner *sc, char *key, size_t keycap, size_t *keylen) {
  size_t n = 0;
  sc->pos++; /* the opening quote */
  for (;;) {
    if (sc->pos >= sc->len) return fail(sc, "unterminated string");
    unsigned char c = sc->s[sc->pos];
    unsigned cp;
    if (c == '"') {
      sc->pos++;
      break;
    }
    if (c < 0x20) return fail(sc, "control character inside a string");
    if (c >= 0x80) {
      size_t start = sc->pos;
      if (!utf8_seq(sc)) return false;
      for (size_t i = start; i < sc->pos; i++, n++)
        if (key && n + 1 < keycap) key[n] = (char)sc->s[i];
      continue;
    }
    sc->pos++;
    if (c != '\\') {
      cp = c;
    } else {
      int e = peek(sc);
      sc->pos++;
      switch (e) {
      case '"':
        cp = '"';
        break;
      case '\\':
        cp = '\\';
        break;
      case '/':
        cp = '/';
        break;
      case 'b':
        cp = '\b';
        break;
      case 'f':
        cp = '\f';
        break;
      case 'n':
        cp = '\n';
        break;
      case 'r':
        cp = '\r';
        break;
      case 't':
        cp = '\t';
        break;
      case 'u': {
        int h = hex4(sc);
        if (h < 0) return fail(sc, "invalid \\u escape");
        cp = (unsigned)h;
        if (cp >= 0xDC00 && cp <= 0xDFFF) return fail(sc, "lone trailing surrogate in \\u escape");
        if (cp >= 0xD800 && cp <= 0xDBFF) {
          if (sc->len - sc->pos < 2 || sc->s[sc->pos] != '\\' || sc->s[sc->pos + 1] != 'u')
            return fail(sc, "lone leading surrogate in \\u escape");
          sc->pos += 2;
          int lo = hex4(sc);
          if (lo < 0xDC00 || lo > 0xDFFF) return fail(sc, "lone leading surrogate in \\u escape");
          cp = 0x10000 + ((cp - 0xD800) << 10) + ((unsigned)lo - 0xDC00);
        }
        if (cp == 0) return fail(sc, "\\u0000 inside a string (names are C strings)");
        break;
      }
      default:
        return fail(sc, "invalid escape");
      }
    }
    /* the decoded bytes, for key comparison (only ASCII keys matter) */
    if (key && n + 1 < keycap) key[n] = cp < 0x80 ? (char)cp : '\x80';
    n += cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
  }
  if (key && keycap) key[n < keycap ? n : keycap - 1] = '\0';
  if (keylen) *keylen = n;
  return true;
}

static bool digits(scanner *sc) {
  size_t start = sc->pos;
  while (sc->pos < sc->len && sc->s[sc->pos] >= '0' && sc->s[sc->pos] <= '9') sc->pos++;
  return sc->pos > start;
}

static bool scan_number(scanner *sc, bool uint_only) {
  size_t start = sc->pos;
  bool integer = true;
  if (peek(sc) == '-') {
    sc->pos++;
    integer = false; /* -0 and negatives: serde reads neither into usize */
  }
  if (peek(sc) == '0') {
    sc->pos++;
    if (peek(sc) >= '0' && peek(sc) <= '9') return fail(sc, "invalid number (leading zero)");
  } else if (!digits(sc)) {
    return fail(sc, "invalid number");
  }
  if (peek(sc) == '.') {
    sc->pos++;
    integer = false;
    if (!digits(sc)) return fail(sc, "invalid number (no digits after the point)");
  }
  if (peek(sc) == 'e' || peek(sc) == 'E') {
    sc->pos++;
    integer = false;
    if (peek(sc) == '+' || peek(sc) == '-') sc->pos++;
    if (!digits(sc)) return fail(sc, "invalid number (no digits in the exponent)");
  }
  if (uint_only && !integer) {
    snprintf(sc->number, sizeof sc->number, "%.*s", (int)(sc->pos - start), sc->s + start);
    return fail(sc, "shape and data_offsets hold unsigned integers (no sign, point or exponent)");
  }
  return true;
}

static bool scan_literal(scanner *sc, const char *word) {
  size_t n = strlen(word);
  if (sc->len - sc->pos < n || memcmp(sc->s + sc->pos, word, n)) return fail(sc, "expected value");
  sc->pos += n;
  return true;
}

static bool scan_value(scanner *sc, scan_ctx ctx);

/* The context of a member's value inside an object of context ctx. */
static scan_ctx member_ctx(const scanner *sc, scan_ctx ctx, const char *key, size_t keylen) {
  if (!(sc->flags & MLO_JSON_ST_INTEGERS)) return CTX_ANY;
  if (ctx == CTX_ROOT) return keylen == 12 && !strcmp(key, "__metadata__") ? CTX_ANY : CTX_ENTRY;
  if (ctx == CTX_ENTRY &&
      ((keylen == 5 && !strcmp(key, "shape")) || (keylen == 12 && !strcmp(key, "data_offsets"))))
    return CTX_UINTS;
  return CTX_ANY;
}

static bool scan_object(scanner *sc, scan_ctx ctx) {
  sc->pos++;
  skip_ws(sc);
  if (peek(sc) == '}') {
    sc->pos++;
    return true;
  }
  for (;;) {
    skip_ws(sc);
    if (peek(sc) != '"')
      return fail(sc, peek(sc) == '}' ? "trailing comma" : "key must be a string");
    char key[96];
    size_t keylen = 0;
    if (!scan_string(sc, key, sizeof key, &keylen)) return false;
    if (ctx == CTX_ROOT) memcpy(sc->entry, key, sizeof key);
    skip_ws(sc);
    if (peek(sc) != ':') return fail(sc, "expected ':'");
    sc->pos++;
    skip_ws(sc);
    if (!scan_value(sc, member_ctx(sc, ctx, key, keylen))) return false;
    skip_ws(sc);
    int c = peek(sc);
    sc->pos++;
    if (c == '}') return true;
    if (c != ',') {
      sc->pos--;
      return fail(sc, "expected ',' or '}'");
    }
  }
}

static bool scan_array(scanner *sc, scan_ctx ctx) {
  sc->pos++;
  skip_ws(sc);
  if (peek(sc) == ']') {
    sc->pos++;
    return true;
  }
  for (;;) {
    skip_ws(sc);
    if (peek(sc) == ']') return fail(sc, "trailing comma");
    if (!scan_value(sc, ctx == CTX_UINTS ? CTX_UINTS : CTX_ANY)) return false;
    skip_ws(sc);
    int c = peek(sc);
    sc->pos++;
    if (c == ']') return true;
    if (c != ',') {
      sc->pos--;
      return fail(sc, "expected ',' or ']'");
    }
  }
}

static bool scan_value(scanner *sc, scan_ctx ctx) {
  int c = peek(sc);
  if (c == '{' || c == '[') {
    if (++sc->depth > MAX_DEPTH) return fail(sc, "nested more than 127 levels deep");
    bool ok = c == '{' ? scan_object(sc, ctx) : scan_array(sc, ctx);
    sc->depth--;
    return ok;
  }
  if (c == '"') return scan_string(sc, NULL, 0, NULL);
  if (c == '-' || (c >= '0' && c <= '9')) return scan_number(sc, ctx == CTX_UINTS);
  if (c == 't') return scan_literal(sc, "true");
  if (c == 'f') return scan_literal(sc, "false");
  if (c == 'n') return scan_literal(sc, "null");
  return fail(sc, c < 0 ? "unexpected end of text" : "expected value");
}

static int cmp_key(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The first key that appears twice in one object of the tree, or NULL. */
static const char *duplicate_key(const cJSON *node, int *oom) {
  for (; node; node = node->next) {
    if (!cJSON_IsObject(node) && !cJSON_IsArray(node)) continue;
    size_t n = 0;
    for (const cJSON *c = node->child; c; c = c->next) n++;
    if (cJSON_IsObject(node) && n > 1) {
      const char **keys = mlo_malloc(n * sizeof *keys);
      if (!keys) {
        *oom = 1;
        return NULL;
      }
      size_t i = 0;
      for (const cJSON *c = node->child; c; c = c->next) keys[i++] = c->string;
      qsort(keys, n, sizeof *keys, cmp_key);
      const char *dup = NULL;
      for (i = 1; i < n && !dup; i++)
        if (!strcmp(keys[i - 1], keys[i])) dup = keys[i];
      free(keys);
      if (dup) return dup;
    }
    const char *dup = duplicate_key(node->child, oom);
    if (dup || *oom) return dup;
  }
  return NULL;
}

int mlo_json_check(const char *text, size_t len, unsigned flags, size_t *at, char *why,
                   size_t whylen) {
  scanner sc = {(const unsigned char *)text, len, 0, flags, 0, NULL, "", ""};
  skip_ws(&sc);
  bool ok = scan_value(&sc, (flags & MLO_JSON_ST_INTEGERS) ? CTX_ROOT : CTX_ANY);
  if (ok) {
    skip_ws(&sc);
    if (sc.pos < sc.len) ok = fail(&sc, "trailing characters after the value");
  }
  if (ok) return MLO_OK;
  if (at) *at = sc.pos;
  if (why && whylen && sc.number[0]) /* name the tensor, as the reader's own errors do */
    snprintf(why, whylen, "tensor '%s': %s; '%s' is not one", sc.entry, sc.why, sc.number);
  else if (why && whylen)
    snprintf(why, whylen, "%s", sc.why);
  return MLO_EFORMAT;
}

int mlo_json_parse(const char *name, const char *what, const char *text, size_t len, unsigned flags,
                   cJSON **out, char *err, size_t errlen) {
  *out = NULL;
  const char *sep = what ? ": " : "", *w = what ? what : "";
  size_t at = 0;
  char why[256];
  if (mlo_json_check(text, len, flags, &at, why, sizeof why))
    return mlo_errf(err, errlen, MLO_EFORMAT, "%s%s%s: not valid JSON at byte %zu: %s", name, sep,
                    w, at, why);
  /* cJSON allocates with the process's malloc: its hooks are global, and a
   * library must not change them under a program that uses cJSON itself.
   * The text passed the strict check above (syntax, and a nesting limit
   * below cJSON's), so a parse that fails now ran out of memory. */
  cJSON *root = cJSON_ParseWithLength(text, len);
  if (!root)
    return mlo_errf(err, errlen, MLO_ENOMEM, "%s%s%s: out of host memory parsing JSON", name, sep,
                    w);
  int oom = 0;
  const char *dup = (flags & MLO_JSON_KEEP_DUPLICATES) ? NULL : duplicate_key(root, &oom);
  if (oom || dup) {
    int rc = oom ? mlo_errf(err, errlen, MLO_ENOMEM, "%s%s%s: out of host memory", name, sep, w)
                 : mlo_errf(err, errlen, MLO_EFORMAT,
                            "%s%s%s: key '%.80s' appears twice in one object", name, sep, w, dup);
    cJSON_Delete(root);
    return rc;
  }
  *out = root;
  return MLO_OK;
}

int mlo_json_read_file(const char *path, size_t cap, unsigned flags, cJSON **out, char *err,
                       size_t errlen) {
  *out = NULL;
  char *text = NULL;
  size_t len = 0;
  int rc = mlo_read_file(path, cap, &text, &len, err, errlen);
  if (!rc) rc = mlo_json_parse(path, NULL, text, len, flags, out, err, errlen);
  free(text);
  return rc;
}
