/*
 * usage_tail.c: token usage from the tail of an LLM response, and the tail buffer that keeps that tail.
 *
 * This is a transcription of the rules in gateway/protocol/usage.py (the specification and the reference
 * implementation); the tests compare both on arbitrary bytes. No allocation, no I/O. Every read is guarded
 * by an index check against the length the caller passed; recursion is bounded by GW_MAX_DEPTH.
 */
#define _GNU_SOURCE /* memrchr */
#include <string.h>

#include "gateway_native.h"

#define TOKEN_LIMIT (UINT64_C(1) << 53)
#define ABSENT UINT64_MAX
#define FAIL SIZE_MAX
#define GW_MAX_DEPTH 32
#define MAX_OBJECT_ATTEMPTS 16

/* Field slots, in the order the Python reference uses. */
enum {
    F_PROMPT,
    F_COMPLETION,
    F_TOTAL,
    F_INPUT,
    F_OUTPUT,
    F_CACHE_READ,
    F_CACHE_CREATION,
    F_PROMPT_CACHED,
    F_INPUT_CACHED,
    F_COUNT
};

typedef struct {
    const char *name;
    size_t len;
    int slot;
} member;

#define MEMBER(name, slot) {name, sizeof(name) - 1, slot}

static const member counted_members[] = {
    MEMBER("prompt_tokens", F_PROMPT),
    MEMBER("completion_tokens", F_COMPLETION),
    MEMBER("total_tokens", F_TOTAL),
    MEMBER("input_tokens", F_INPUT),
    MEMBER("output_tokens", F_OUTPUT),
    MEMBER("cache_read_input_tokens", F_CACHE_READ),
    MEMBER("cache_creation_input_tokens", F_CACHE_CREATION),
};
static const member details_members[] = {
    MEMBER("prompt_tokens_details", F_PROMPT_CACHED),
    MEMBER("input_tokens_details", F_INPUT_CACHED),
};
static const member cached_member = MEMBER("cached_tokens", 0);

#define COUNT_OF(a) (sizeof(a) / sizeof((a)[0]))

/* What an object's members are captured into: the usage object itself (TOP), a details object whose
 * cached_tokens goes to one slot (DETAILS), or nothing. */
typedef enum { CAPTURE_NONE, CAPTURE_TOP, CAPTURE_DETAILS } capture_kind;

typedef struct {
    const unsigned char *s;
    size_t n;
    uint64_t fields[F_COUNT];
} parser;

static size_t scan_value(parser *p, size_t i, int depth);
static size_t scan_object(parser *p, size_t i, int depth, capture_kind kind, int details_slot);

static int is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
static int is_hex(unsigned char c) {
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static size_t skip_ws(const parser *p, size_t i) {
    while (i < p->n && is_ws(p->s[i])) i++;
    return i;
}

static int at(const parser *p, size_t i, unsigned char c) { return i < p->n && p->s[i] == c; }

/* s[i] is the opening quote. */
static size_t scan_string(const parser *p, size_t i) {
    i++;
    while (i < p->n) {
        unsigned char c = p->s[i];
        if (c == '"') return i + 1;
        if (c < 0x20) return FAIL;
        if (c != '\\') {
            i++;
            continue;
        }
        if (i + 1 >= p->n) return FAIL;
        unsigned char e = p->s[i + 1];
        if (e == 'u') {
            if (p->n - i < 6) return FAIL;
            for (size_t k = 2; k < 6; k++)
                if (!is_hex(p->s[i + k])) return FAIL;
            i += 6;
        } else if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' ||
                   e == 't') {
            i += 2;
        } else {
            return FAIL;
        }
    }
    return FAIL;
}

static size_t scan_digits(const parser *p, size_t i) {
    while (i < p->n && is_digit(p->s[i])) i++;
    return i;
}

/* A JSON number at s[i]; *value gets it when it is a plain integer <= 2^53, else ABSENT. */
static size_t scan_number(const parser *p, size_t i, uint64_t *value) {
    int plain = 1;
    uint64_t v = 0;
    if (at(p, i, '-')) {
        plain = 0;
        i++;
    }
    if (at(p, i, '0')) {
        i++;
    } else if (i < p->n && p->s[i] >= '1' && p->s[i] <= '9') {
        for (; i < p->n && is_digit(p->s[i]); i++)
            if (v <= TOKEN_LIMIT) v = v * 10 + (uint64_t)(p->s[i] - '0'); /* at most 9.1e16: no overflow */
    } else {
        return FAIL;
    }
    if (at(p, i, '.')) {
        plain = 0;
        size_t j = scan_digits(p, i + 1);
        if (j == i + 1) return FAIL;
        i = j;
    }
    if (at(p, i, 'e') || at(p, i, 'E')) {
        plain = 0;
        i++;
        if (at(p, i, '+') || at(p, i, '-')) i++;
        size_t j = scan_digits(p, i);
        if (j == i) return FAIL;
        i = j;
    }
    *value = (plain && v <= TOKEN_LIMIT) ? v : ABSENT;
    return i;
}

static size_t scan_literal(const parser *p, size_t i, const char *lit, size_t len) {
    if (p->n - i < len || memcmp(p->s + i, lit, len) != 0) return FAIL;
    return i + len;
}

static size_t scan_array(parser *p, size_t i, int depth) {
    if (depth > GW_MAX_DEPTH) return FAIL;
    i = skip_ws(p, i + 1);
    if (at(p, i, ']')) return i + 1;
    for (;;) {
        i = scan_value(p, i, depth);
        if (i == FAIL) return FAIL;
        i = skip_ws(p, i);
        if (at(p, i, ']')) return i + 1;
        if (!at(p, i, ',')) return FAIL;
        i = skip_ws(p, i + 1);
    }
}

/* Any JSON value starting exactly at s[i]; containers inside it sit at depth + 1. */
static size_t scan_value(parser *p, size_t i, int depth) {
    if (i >= p->n) return FAIL;
    uint64_t ignored;
    switch (p->s[i]) {
    case '{':
        return scan_object(p, i, depth + 1, CAPTURE_NONE, 0);
    case '[':
        return scan_array(p, i, depth + 1);
    case '"':
        return scan_string(p, i);
    case 't':
        return scan_literal(p, i, "true", 4);
    case 'f':
        return scan_literal(p, i, "false", 5);
    case 'n':
        return scan_literal(p, i, "null", 4);
    default:
        return scan_number(p, i, &ignored);
    }
}

static const member *find_member(const member *table, size_t count, const unsigned char *name, size_t len) {
    for (size_t k = 0; k < count; k++)
        if (table[k].len == len && memcmp(table[k].name, name, len) == 0) return &table[k];
    return NULL;
}

static size_t scan_counted(parser *p, size_t i, int depth, int slot) {
    if (i < p->n && (p->s[i] == '-' || is_digit(p->s[i]))) return scan_number(p, i, &p->fields[slot]);
    p->fields[slot] = ABSENT;
    return scan_value(p, i, depth);
}

/* s[i] is '{'. */
static size_t scan_object(parser *p, size_t i, int depth, capture_kind kind, int details_slot) {
    if (depth > GW_MAX_DEPTH) return FAIL;
    i = skip_ws(p, i + 1);
    if (at(p, i, '}')) return i + 1;
    for (;;) {
        if (!at(p, i, '"')) return FAIL;
        size_t end = scan_string(p, i);
        if (end == FAIL) return FAIL;
        const unsigned char *name = p->s + i + 1;
        size_t name_len = end - i - 2;
        i = skip_ws(p, end);
        if (!at(p, i, ':')) return FAIL;
        i = skip_ws(p, i + 1);

        const member *m;
        if (kind == CAPTURE_TOP &&
            (m = find_member(counted_members, COUNT_OF(counted_members), name, name_len)) != NULL) {
            i = scan_counted(p, i, depth, m->slot);
        } else if (kind == CAPTURE_TOP &&
                   (m = find_member(details_members, COUNT_OF(details_members), name, name_len)) != NULL) {
            p->fields[m->slot] = ABSENT;
            if (at(p, i, '{'))
                i = scan_object(p, i, depth + 1, CAPTURE_DETAILS, m->slot);
            else
                i = scan_value(p, i, depth);
        } else if (kind == CAPTURE_DETAILS && find_member(&cached_member, 1, name, name_len) != NULL) {
            i = scan_counted(p, i, depth, details_slot);
        } else {
            i = scan_value(p, i, depth);
        }
        if (i == FAIL) return FAIL;
        i = skip_ws(p, i);
        if (at(p, i, '}')) return i + 1;
        if (!at(p, i, ',')) return FAIL;
        i = skip_ws(p, i + 1);
    }
}

static uint64_t field_or_zero(const parser *p, int slot) {
    return p->fields[slot] == ABSENT ? 0 : p->fields[slot];
}

static uint64_t saturate(uint64_t v) { return v > TOKEN_LIMIT ? TOKEN_LIMIT : v; }

static int to_usage(const parser *p, gw_usage *out) {
    const uint64_t *f = p->fields;
    if (f[F_PROMPT] == ABSENT && f[F_COMPLETION] == ABSENT && f[F_TOTAL] == ABSENT && f[F_INPUT] == ABSENT &&
        f[F_OUTPUT] == ABSENT)
        return 0;
    /* Each term is at most 2^53, so no sum below can overflow 64 bits. */
    uint64_t prompt = f[F_PROMPT] != ABSENT
                          ? f[F_PROMPT]
                          : saturate(field_or_zero(p, F_INPUT) + field_or_zero(p, F_CACHE_READ) +
                                     field_or_zero(p, F_CACHE_CREATION));
    uint64_t completion = f[F_COMPLETION] != ABSENT ? f[F_COMPLETION] : field_or_zero(p, F_OUTPUT);
    uint64_t total = f[F_TOTAL] != ABSENT ? f[F_TOTAL] : saturate(prompt + completion);
    uint64_t cached = f[F_PROMPT_CACHED] != ABSENT  ? f[F_PROMPT_CACHED]
                      : f[F_INPUT_CACHED] != ABSENT ? f[F_INPUT_CACHED]
                                                    : field_or_zero(p, F_CACHE_READ);
    out->prompt_tokens = prompt;
    out->completion_tokens = completion;
    out->total_tokens = total;
    out->cached_tokens = cached;
    return 1;
}

static const char usage_key[] = "\"usage\"";
#define KEY_LEN (sizeof(usage_key) - 1)

/* Start of the last occurrence of the key lying wholly inside s[0, end), or FAIL. It jumps between the
 * occurrences of 'g' (memrchr is vectorised): of the key's bytes, 'g' is the rarest in JSON responses,
 * where '"' comes every few bytes. A key ending before `end` has its 'g' (index 4) in s[4, end - 2). */
static size_t rfind_key(const unsigned char *s, size_t end) {
    while (end >= KEY_LEN) {
        const unsigned char *g = memrchr(s + 4, 'g', end - 6);
        if (g == NULL) return FAIL;
        size_t start = (size_t)(g - s) - 4;
        if (memcmp(s + start, usage_key, KEY_LEN) == 0) return start;
        end = start + KEY_LEN - 1; /* the next 'g' to test lies before this one */
    }
    return FAIL;
}

static int escaped(const unsigned char *s, size_t pos) {
    size_t run = 0;
    while (pos > run && s[pos - run - 1] == '\\') run++;
    return run % 2 == 1;
}

int gw_usage_parse(const char *data, size_t len, gw_usage *out) {
    if (data == NULL || out == NULL) return 0;
    parser p = {.s = (const unsigned char *)data, .n = len};
    size_t end = len;
    int attempts = 0;
    for (;;) {
        size_t pos = rfind_key(p.s, end);
        if (pos == FAIL) return 0;
        end = pos + KEY_LEN - 1;
        if (escaped(p.s, pos)) continue;
        size_t i = skip_ws(&p, pos + KEY_LEN);
        if (!at(&p, i, ':')) continue;
        i = skip_ws(&p, i + 1);
        if (!at(&p, i, '{')) continue;
        if (++attempts > MAX_OBJECT_ATTEMPTS) return 0;
        for (int k = 0; k < F_COUNT; k++) p.fields[k] = ABSENT;
        if (scan_object(&p, i, 1, CAPTURE_TOP, 0) != FAIL && to_usage(&p, out)) return 1;
    }
}

/* ---- the tail buffer ---------------------------------------------------------------------------- */

size_t gw_tail_start(const gw_tail *tail) { return tail->len > tail->cap ? tail->len - tail->cap : 0; }

void gw_tail_append(gw_tail *tail, const char *data, size_t n) {
    size_t cap = tail->cap;
    if (tail->buf == NULL || cap == 0 || data == NULL || n == 0) return;
    if (tail->len > 2 * cap) tail->len = 0; /* corrupted state: start over rather than write out of bounds */
    if (n >= cap) {
        memcpy(tail->buf, data + (n - cap), cap);
        tail->len = cap;
        return;
    }
    if (tail->len + n > 2 * cap) {
        /* Compact: keep the cap - n newest bytes, so the window is whole once the chunk is in. The
         * buffer is twice the window, so this runs at most once per cap bytes appended. */
        size_t keep = cap - n;
        memmove(tail->buf, tail->buf + (tail->len - keep), keep);
        tail->len = keep;
    }
    memcpy(tail->buf + tail->len, data, n);
    tail->len += n;
}

int gw_tail_usage(const gw_tail *tail, gw_usage *out) {
    if (tail->buf == NULL || tail->len > 2 * tail->cap) return 0;
    size_t start = gw_tail_start(tail);
    return gw_usage_parse(tail->buf + start, tail->len - start, out);
}
