/*
 * gateway_native.h: the C surface of gateway._gateway_native.
 *
 * Independent parts:
 *   - usage_tail.c: find the token usage in the last bytes of an LLM response (a pure function of bytes),
 *     and a fixed-capacity tail buffer that keeps those last bytes;
 *   - buckets.c: 64-bit atomics on caller-provided (usually shared) memory, and a lock-free table of GCRA
 *     rate buckets and concurrency gauges living in such memory;
 *   - usage_ring.c: single-producer/single-consumer rings of records (usage records in one slot each, body
 *     logs across several) in such memory, one ring per producer process and one consumer for all of them;
 *   - json_member.c: where a top-level member's string value sits in a JSON body (to rewrite the model
 *     name without touching any other byte);
 *   - sse_usage.c: a stream's "usage":null members taken out, for a client that did not ask for usage;
 *   - http1_chunks.c: the whole chunks of a chunked body's read, unframed in one pass;
 *   - prefix_index.c: chained hashes of a prompt's blocks, and a bounded, shared index of which backend
 *     was sent which of them (what prefix-cache-aware routing reads).
 *
 * No function here allocates, blocks, or performs I/O; the only system call is clock_gettime.
 *
 * The declarations between the "cffi:begin" and "cffi:end" markers are also what native/_ffi_build.py
 * hands to cffi's cdef, so they must stay in the plain-C subset cffi parses: no preprocessor lines, no
 * macros, no attributes.
 */
#ifndef GATEWAY_NATIVE_H
#define GATEWAY_NATIVE_H

#include <stddef.h>
#include <stdint.h>

/* cffi:begin */

/* Return codes. Non-negative values are outcomes, negative values are errors. */
enum {
    GW_OK = 0,
    GW_REFUSED = 0,   /* take: not admitted now; retry_after_ns says for how long */
    GW_ADMITTED = 1,  /* take: admitted */
    GW_TOO_LARGE = 2, /* take: n > burst, never admissible under this limit */
    GW_OVER_BUDGET = 3, /* admit: a budget window has reached its limit */
    GW_EINVAL = -1,   /* an argument is out of range (rate <= 0 or not finite, negative count, key 0) */
    GW_EFULL = -2,    /* the bucket table has no free slot for a new key */
    GW_EREGION = -3   /* the region is NULL, misaligned, too small or not initialised */
};

/* ---- usage_tail.c ----------------------------------------------------------------------------- */

/* Token counts; every value is in [0, 2^53]. */
typedef struct {
    uint64_t prompt_tokens;
    uint64_t completion_tokens;
    uint64_t total_tokens;
    uint64_t cached_tokens;
} gw_usage;

/* Parse the usage out of the tail of a response (see gateway/protocol/usage.py for the exact rules, which
 * this function implements byte for byte). Returns 1 and fills *out when found, 0 when not (out is then
 * left untouched). Reads only data[0, len). */
int gw_usage_parse(const char *data, size_t len, gw_usage *out);

/* A sliding window over the last `cap` bytes appended. `buf` points to 2 * cap bytes owned by the caller;
 * the window is buf[len - min(len, cap), len). Set cap, buf and len = 0 before the first append. */
typedef struct {
    char *buf;
    size_t cap;
    size_t len;
} gw_tail;

/* Append n bytes; copies at most cap bytes of `data`, plus at most cap bytes of compaction. */
void gw_tail_append(gw_tail *tail, const char *data, size_t n);

/* gw_usage_parse over the current window. */
int gw_tail_usage(const gw_tail *tail, gw_usage *out);

/* Offset into buf where the current window starts; the window is len - start bytes long. */
size_t gw_tail_start(const gw_tail *tail);

/* ---- buckets.c: plain atomics ----------------------------------------------------------------- */

/* Sequentially consistent operations on the 8-byte word at base + off. The caller guarantees that off is
 * a multiple of 8 inside the buffer and that base is 8-aligned (gateway/native/_shared.py checks both). */
uint64_t gw_load_u64(const char *base, size_t off);
void gw_store_u64(char *base, size_t off, uint64_t value);
int64_t gw_fetch_add_i64(char *base, size_t off, int64_t delta); /* returns the previous value */
int gw_cas_u64(char *base, size_t off, uint64_t expected, uint64_t desired); /* 1 if swapped */

/* ---- buckets.c: the bucket table --------------------------------------------------------------- */

/* CLOCK_MONOTONIC in nanoseconds; the same clock in every process of the host. */
int64_t gw_monotonic_ns(void);

/* Bytes needed for a table of `capacity` slots (a power of two in [1, 2^24]); 0 if capacity is invalid. */
uint64_t gw_bt_region_size(uint64_t capacity);

/* Zero region[0, gw_bt_region_size(capacity)) and write the header. Call once, before other processes
 * use the region. */
int gw_bt_init(char *base, size_t size, uint64_t capacity);

/* The capacity recorded in an initialised region, or GW_EREGION. */
int64_t gw_bt_capacity(const char *base, size_t size);

/* Every function below validates the region against `size` on each call and takes now_ns: a time on
 * CLOCK_MONOTONIC, or any negative value to read the clock. Keys are nonzero. */

/* GCRA admission of n units. Returns GW_ADMITTED, GW_REFUSED or GW_TOO_LARGE, or an error.
 * out[0] = nanoseconds until the request would be admitted (0 when admitted, -1 when GW_TOO_LARGE);
 * out[1] = units that could still be admitted at now_ns after this decision. */
int gw_bt_take(char *base, size_t size, uint64_t key, double rate_per_s, int64_t burst, int64_t n,
               int64_t now_ns, int64_t *out);

/* Charge (delta > 0) or refund (delta < 0) delta units without an admission check. Returns GW_OK. */
int gw_bt_settle(char *base, size_t size, uint64_t key, double rate_per_s, int64_t delta, int64_t now_ns);

/* Read-only: out[0] = units admissible now, out[1] = nanoseconds until the bucket is full again. */
int gw_bt_peek(const char *base, size_t size, uint64_t key, double rate_per_s, int64_t burst,
               int64_t now_ns, int64_t *out);

/* Concurrency gauge: acquire returns 1 (incremented) or 0 (already at limit); release returns the new
 * value, never going below 0; gauge returns the current value (0 for an unknown key). */
int gw_bt_acquire(char *base, size_t size, uint64_t key, int64_t limit);
int64_t gw_bt_release(char *base, size_t size, uint64_t key);
int64_t gw_bt_gauge(const char *base, size_t size, uint64_t key);

/* Budget spend of one window: a live part that many processes add to, and a base that one process sets.
 * spend_add claims the slot and adds atomically to each live word; spend_set_base claims it and stores the
 * base; spend_read fills out[0..3] = live tokens, live cost, base tokens, base cost (zeros for an unknown
 * key, which is not claimed). Each word is atomic on its own; the four are not one snapshot. */
int gw_bt_spend_add(char *base, size_t size, uint64_t key, int64_t tokens, int64_t cost);
int gw_bt_spend_set_base(char *base, size_t size, uint64_t key, int64_t tokens, int64_t cost);
int gw_bt_spend_read(const char *base, size_t size, uint64_t key, int64_t *out);

/* ---- buckets.c: notes and admission plans ------------------------------------------------------ */

/* A worker notes every gauge place it holds in its own block of words of a notes region (which outlives
 * the worker), so that its successor can release what a killed worker held. Note blocks are given as a
 * byte offset (a multiple of 8) into the notes region; a negative offset means "not noted". A note word
 * is written before its place is taken and cleared after it is given back. */

/* Take one place of `limit` on gauge `key`, noted in word 0 of the block: 1 taken, 0 full, or an error. */
int gw_bt_enter(char *base, size_t size, uint64_t key, int64_t limit, char *notes, size_t notes_size,
                int64_t note_off);

/* Give the place back and clear its note; returns the gauge's new value, or an error. */
int64_t gw_bt_leave(char *base, size_t size, uint64_t key, char *notes, size_t notes_size, int64_t note_off);

enum { GW_LIMIT_REQUESTS = 0, GW_LIMIT_TOKENS = 1, GW_LIMIT_CONCURRENCY = 2, GW_PLAN_MAX = 64 };

/* One limit of a request's admission plan. Rate limits (requests, tokens) are GCRA buckets: `limit` is
 * the burst and rate_per_s the refill; a request takes 1 request or min(tokens, limit) tokens. A
 * concurrency limit is a gauge of `limit` places (rate_per_s unused). */
typedef struct {
    uint64_t key;
    double rate_per_s;
    int64_t limit;
    int64_t kind;
} gw_limit;

/* A budget window a request answers to: the key of its spend words and its limits per window, tokens and
 * cost in nano-units (-1: none). Spend is live plus base (gw_bt_spend_read). */
typedef struct {
    uint64_t key;
    int64_t tokens;
    int64_t cost;
} gw_window;

/* The admission phase of one request, in one call: first every budget window (read only: a window whose
 * spend has reached either of its limits refuses), then every limit of a plan (at most GW_PLAN_MAX), in
 * order, all or nothing: the first limit that refuses makes everything taken before it be given back.
 * The plan's k-th gauge is noted in word k of the note block. Returns GW_ADMITTED, GW_REFUSED,
 * GW_OVER_BUDGET or an error (nothing then stays taken).
 *   GW_OVER_BUDGET: out[0] = index of the window, out[1], out[2] = its spend, tokens and cost;
 *   otherwise out[0] = index of the refusing limit (-1 when admitted);
 *   out[1] = ns until it could admit (refused; -1 never at this limit; 1e9 for a full gauge);
 *   out[2], out[3] = index and remaining units of the requests bucket with the fewest left (-1, 0: none);
 *   out[4], out[5] = the same for tokens. */
int gw_bt_admit(char *base, size_t size, const gw_window *windows, int64_t nw, const gw_limit *limits,
                int64_t n, int64_t tokens, char *notes, size_t notes_size, int64_t note_off, int64_t now_ns,
                int64_t *out);

/* The settling phase of one admitted request, in one call: settle every tokens bucket of the plan by `used`
 * minus what was taken for `tokens` (no settling when used < 0: the reservation stands), give back every
 * gauge place and clear its note, then add spend_tokens and spend_cost to the live spend of every window
 * (none when both are 0). Returns how many windows hold the spend: nw, or fewer when the table had no slot
 * for the next one (the windows before it hold it); or an error for invalid arguments (nothing done). */
int gw_bt_finish(char *base, size_t size, const gw_limit *limits, int64_t n, int64_t tokens, int64_t used,
                 char *notes, size_t notes_size, int64_t note_off, const gw_window *windows, int64_t nw,
                 int64_t spend_tokens, int64_t spend_cost, int64_t now_ns);

/* ---- json_member.c ------------------------------------------------------------------------------ */

/* The span [out[0], out[1]) of the string value, quotes included, of the last top-level member of the JSON
 * object in data[0, len) whose name is exactly the key_len bytes at `key` (written without escapes).
 * Returns 1 when found, 0 when not (out is then left untouched). For a body already parsed as JSON; never
 * reads outside data[0, len) whatever the bytes. */
int gw_json_member_span(const char *data, size_t len, const char *key, size_t key_len, int64_t *out);

/* How many members the top-level object of the JSON text in data[0, len) has as written: the colons at
 * depth 1 outside strings. Compared with the parsed object's size, it tells a body with a duplicate member
 * (however its name is spelled: "model" and "\u006dodel" are one name once parsed). For a body already
 * parsed as a JSON object; never reads outside data[0, len). -1 when an object or array opens deeper than
 * max_depth (the top-level object is depth 1): the body is refused before anything walks it. */
int64_t gw_json_top_members(const char *data, size_t len, int64_t max_depth);

/* ---- sse_usage.c -------------------------------------------------------------------------------- */

/* Copies the n bytes at `in` to `out` (room for n bytes) without each ,"usage":null or , "usage": null
 * that stands directly before a '}' followed by '\n' or '\r'. Returns (bytes written << 1) | 1 when a
 * "usage" is left in what was written (a usage object, or a null not in that place), | 0 when none is. */
int64_t gw_sse_strip_usage_nulls(const char *in, size_t n, char *out);

/* ---- http1_chunks.c ----------------------------------------------------------------------------- */

/* From data[pos], every whole chunk with a plain size line (1-15 hex digits, CRLF), its data and its CRLF:
 * the data copied to `out` (room for n - pos bytes), *written set to how many bytes. Returns where the
 * first chunk that is not such starts (pos itself when none was). */
int64_t gw_http1_whole_chunks(const char *data, size_t n, size_t pos, char *out, int64_t *written);

/* ---- usage_ring.c: SPSC record rings in shared memory ---------------------------------------- */

/* Bytes for `rings` rings (in [1, 4096]) of `slots` slots (a power of two in [2, 2^20]) of `slot_bytes`
 * bytes each (a multiple of 64 in [64, 65536]); 0 when any argument is invalid. A record holds at most
 * slot_bytes - 8 bytes. */
uint64_t gw_ring_region_size(uint64_t rings, uint64_t slots, uint64_t slot_bytes);

/* Zero region[0, gw_ring_region_size(...)) and write the header. Call once, before other processes use
 * the region. GW_EINVAL for bad geometry, GW_EREGION for a NULL, misaligned or too small region. */
int gw_ring_init(char *base, size_t size, uint64_t rings, uint64_t slots, uint64_t slot_bytes);

/* Every function below validates the region against `size` on each call (GW_EREGION when it is not an
 * initialised ring region of at most `size` bytes) and returns GW_EINVAL for ring >= rings. */

/* out[0] = rings, out[1] = slots, out[2] = slot_bytes. */
int gw_ring_geometry(const char *base, size_t size, uint64_t *out);

/* Producer of `ring` (one process at a time): copy a record of len bytes into the ring. Returns 1 when
 * pushed, 0 when the ring is full, GW_EINVAL when len > slot_bytes - 8. The record becomes visible to the
 * consumer only once completely copied. */
int gw_ring_push(char *base, size_t size, uint64_t ring, const char *data, size_t len);

/* Consumer: copy up to max_records pending records, oldest first, WITHOUT consuming them, into out as
 * consecutive entries [uint32 length, host order][payload, unpadded]; stops early at the first entry that
 * would not fit in out_cap bytes. Returns the number of records copied. A slot whose stored length exceeds
 * slot_bytes - 8 (a scribbled region) is returned as a zero-length record. */
int64_t gw_ring_read(const char *base, size_t size, uint64_t ring, char *out, size_t out_cap,
                     uint64_t max_records);

/* Consumer: consume the n oldest pending records; GW_EINVAL when fewer than n are pending. */
int gw_ring_advance(char *base, size_t size, uint64_t ring, uint64_t n);

/* out[0] = head (records ever pushed), out[1] = tail (records ever consumed). */
int gw_ring_counters(const char *base, size_t size, uint64_t ring, uint64_t *out);

/* Producer: copy a record of any length across as many consecutive slots as it needs (slot_bytes - 8 bytes
 * each, one slot for an empty record), published at once. Returns 1 when pushed; 0 when the ring has no
 * room for it now, or could never hold it (longer than all its slots), and then counts it as dropped. */
int gw_ring_push_span(char *base, size_t size, uint64_t ring, const char *data, size_t len);

/* Consumer of a ring of gw_ring_push_span records: copy up to max_records pending records, each joined
 * again, as gw_ring_read does; *slots_out = the slots they took, which is what gw_ring_advance consumes.
 * Stops early at the first record that would not fit in out_cap bytes. Slots that do not read as one
 * record (a scribbled region) come back as one zero-length record per slot. */
int64_t gw_ring_read_spans(const char *base, size_t size, uint64_t ring, char *out, size_t out_cap,
                           uint64_t max_records, uint64_t *slots_out);

/* *out = the records the producer of `ring` dropped (gw_ring_push_span), ever. */
int gw_ring_dropped(const char *base, size_t size, uint64_t ring, uint64_t *out);

/* ---- prefix_index.c ------------------------------------------------------------------------------- */

/* Bytes an index of `entries` slots needs (a power of two in [8, 2^28]); 0 when `entries` is not one. */
uint64_t gw_pix_region_size(uint64_t entries);

/* Zero and lay out an index in base[0, size); `secret` seeds every block hash (a host's own). */
int gw_pix_init(char *base, size_t size, uint64_t entries, uint64_t secret);

/* The slots of an initialised index, or GW_EREGION. */
int64_t gw_pix_entries(const char *base, size_t size);

/* The chained hashes of the first min(len / block, max_out) whole blocks of data into out: out[i] covers
 * data[0, (i + 1) * block). Returns how many were written. */
int64_t gw_pix_hash_blocks(const char *base, size_t size, const char *data, size_t len, uint32_t block,
                           uint64_t *out, uint32_t max_out);

/* As gw_pix_hash_blocks, the chain starting after `prev` (a hash it returned) instead of at the start. */
int64_t gw_pix_hash_after(const char *base, size_t size, uint64_t prev, const char *data, size_t len,
                          uint32_t block, uint64_t *out, uint32_t max_out);

/* How many leading blocks of hashes[0, n) the index holds for `target` (a hash naming the backend). */
int64_t gw_pix_match(const char *base, size_t size, const uint64_t *hashes, uint32_t n, uint64_t target);

/* Note that `target` was sent hashes[0, n), evicting the least recently used pair of a full set; returns
 * how many pairs were evicted. */
int64_t gw_pix_insert(char *base, size_t size, const uint64_t *hashes, uint32_t n, uint64_t target);

/* gw_pix_insert with the pairs pinned (when `pinned`): an unpinned insert never evicts them from a set
 * that has an unpinned way. */
int64_t gw_pix_insert_pinned(char *base, size_t size, const uint64_t *hashes, uint32_t n, uint64_t target,
                             int pinned);

/* Remove the pairs (hashes[i], target) the index holds; returns how many it held. */
int64_t gw_pix_forget(char *base, size_t size, const uint64_t *hashes, uint32_t n, uint64_t target);

/* Remove every pair of `target` (a scan of the whole table); returns how many. */
int64_t gw_pix_forget_target(char *base, size_t size, uint64_t target);

/* Count one routing decision that took a target's prefix from exact pairs (`held`: they held a block). */
int gw_pix_count_exact(char *base, size_t size, int held);

/* How many pairs the index holds for `target` now (0 for a target never inserted). */
int64_t gw_pix_held(const char *base, size_t size, uint64_t target);

/* out[0] = insert calls, out[1] = pairs inserted or refreshed, out[2] = pairs evicted, out[3] = decisions
 * from exact pairs, out[4] = of those, the ones where they held a block; ever. */
int gw_pix_stats(const char *base, size_t size, uint64_t *out);

/* cffi:end */

#endif /* GATEWAY_NATIVE_H */
