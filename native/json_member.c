/*
 * json_member.c: where the value of a top-level member of a JSON object is, in its bytes.
 *
 * The request path rewrites one member of the client's body (the model name, for a backend that knows the
 * model by another name) and leaves every other byte as the client sent it. The body has already been
 * parsed as JSON, so this is not a validator: it walks the structure, skipping each string with memchr
 * to its closing quote (escaped quotes told apart by the backslashes before them), and counts brackets
 * outside strings. gateway/protocol/openai_request.py (find_model_span) is the reference it follows byte
 * for byte: the last top-level occurrence of the key, spelled without escapes, whose value is a string.
 *
 * gw_json_top_members counts the top-level object's members as written, so that a body naming one twice
 * can be refused, and says when the body nests deeper than the gateway's one depth limit (-1), in the same
 * pass (gateway/protocol/json_members.py is its reference).
 *
 * Reads only data[0, len); no allocation, no I/O.
 */
#include <string.h>

#include "gateway_native.h"

/* The index of the quote closing the string whose opening quote is at `open`, or len when there is none. */
static size_t string_end(const char *data, size_t len, size_t open) {
    size_t from = open + 1;
    while (from < len) {
        const char *q = memchr(data + from, '"', len - from);
        if (q == NULL) return len;
        size_t end = (size_t)(q - data);
        size_t slashes = 0;
        while (end - slashes > open + 1 && data[end - slashes - 1] == '\\') slashes++;
        if (slashes % 2 == 0) return end;
        from = end + 1; /* an escaped quote: the string goes on */
    }
    return len;
}

static int json_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

int gw_json_member_span(const char *data, size_t len, const char *key, size_t key_len, int64_t *out) {
    if (data == NULL || key == NULL || out == NULL) return 0;
    int found = 0;
    int64_t depth = 0;
    size_t pos = 0;
    while (pos < len) {
        char c = data[pos];
        if (c == '{' || c == '[') {
            depth++;
            pos++;
            continue;
        }
        if (c == '}' || c == ']') {
            depth--;
            pos++;
            continue;
        }
        if (c != '"') {
            pos++;
            continue;
        }
        size_t start = pos;
        size_t end = string_end(data, len, start);
        if (end >= len) return found;
        pos = end + 1;
        if (depth != 1 || end - start - 1 != key_len || memcmp(data + start + 1, key, key_len) != 0) continue;
        size_t p = pos;
        while (p < len && json_space(data[p])) p++;
        if (p >= len || data[p] != ':') continue;
        p++;
        while (p < len && json_space(data[p])) p++;
        if (p >= len || data[p] != '"') continue;
        size_t value_end = string_end(data, len, p);
        if (value_end >= len) continue;
        out[0] = (int64_t)p;
        out[1] = (int64_t)value_end + 1;
        found = 1;
        pos = value_end + 1;
    }
    return found;
}

int64_t gw_json_top_members(const char *data, size_t len, int64_t max_depth) {
    if (data == NULL) return 0;
    int64_t depth = 0, members = 0;
    size_t pos = 0;
    while (pos < len) {
        /* Most of a request body is inside strings, which string_end skips with memchr; the bytes
         * stepped over one by one here are structure, numbers and white space. */
        char c = data[pos];
        if (c == '"') {
            size_t end = string_end(data, len, pos);
            if (end >= len) return members;
            pos = end + 1;
            continue;
        }
        if (c == '{' || c == '[') {
            if (++depth > max_depth) return -1;
        } else if (c == '}' || c == ']') depth--;
        else if (c == ':' && depth == 1) members++;
        pos++;
    }
    return members;
}
