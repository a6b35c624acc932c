/*
 * buckets.c: 64-bit atomics on caller-provided memory, and a lock-free table of GCRA rate buckets and
 * concurrency gauges in a region that forked worker processes share.
 *
 * Region layout (all words little-endian host uint64, the region 8-aligned):
 *   header, 64 bytes: [0] magic, [1] capacity (a power of two), [2] slot size, [3..7] reserved
 *   capacity slots of 64 bytes (one cache line each, so neighbours do not false-share):
 *     [0] key (0 = free; claimed once by CAS, never released)
 *     [1] TAT, the GCRA theoretical arrival time, in ns on CLOCK_MONOTONIC
 *     [2] concurrency gauge
 *     [3] live spend, tokens     [4] live spend, cost   (added to by proxy workers)
 *     [5] base spend, tokens     [6] base spend, cost   (set by the control worker)
 *     [7] reserved
 * A key names one kind of use: rate limits use [1], gauges [2], budget windows [3..6].
 *
 * A slot is found by linear probing from a mix of its key. Every operation is one CAS loop on one word,
 * so a process that dies mid-operation leaves no lock behind. Times are signed 64-bit nanoseconds kept
 * in [0, TIME_MAX] by saturating arithmetic, which keeps every addition below free of overflow.
 *
 * No allocation, no I/O; the only system call is clock_gettime.
 */
#define _GNU_SOURCE
#include <math.h>
#include <string.h>
#include <time.h>

#include "gateway_native.h"

#define MAGIC UINT64_C(0x31304B4342574747) /* "GGWBCK01" */
#define SLOT_BYTES 64
#define SLOT_WORDS (SLOT_BYTES / 8)
#define MAX_CAPACITY (UINT64_C(1) << 24)
#define W_KEY 0
#define W_TAT 1
#define W_GAUGE 2
#define W_LIVE_TOKENS 3
#define W_LIVE_COST 4
#define W_BASE_TOKENS 5
#define W_BASE_COST 6

#define TIME_MAX (INT64_C(1) << 62) /* ~146 years of nanoseconds */
#define SPAN_MAX (INT64_C(1) << 61)

/* ---- plain atomics --------------------------------------------------------------------------------- */

static uint64_t *word_at(const char *base, size_t off) { return (uint64_t *)(uintptr_t)(base + off); }

uint64_t gw_load_u64(const char *base, size_t off) {
    return __atomic_load_n(word_at(base, off), __ATOMIC_SEQ_CST);
}

void gw_store_u64(char *base, size_t off, uint64_t value) {
    __atomic_store_n(word_at(base, off), value, __ATOMIC_SEQ_CST);
}

int64_t gw_fetch_add_i64(char *base, size_t off, int64_t delta) {
    /* Unsigned arithmetic wraps without UB; the result is reinterpreted as two's complement. */
    uint64_t prev = __atomic_fetch_add(word_at(base, off), (uint64_t)delta, __ATOMIC_SEQ_CST);
    return (int64_t)prev;
}

int gw_cas_u64(char *base, size_t off, uint64_t expected, uint64_t desired) {
    return __atomic_compare_exchange_n(word_at(base, off), &expected, desired, 0, __ATOMIC_SEQ_CST,
                                       __ATOMIC_SEQ_CST);
}

int64_t gw_monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---- region ------------------------------------------------------------------------------------------ */

uint64_t gw_bt_region_size(uint64_t capacity) {
    if (capacity == 0 || capacity > MAX_CAPACITY || (capacity & (capacity - 1)) != 0) return 0;
    return (capacity + 1) * SLOT_BYTES;
}

int gw_bt_init(char *base, size_t size, uint64_t capacity) {
    uint64_t need = gw_bt_region_size(capacity);
    if (need == 0) return GW_EINVAL;
    if (base == NULL || ((uintptr_t)base & 7) != 0 || size < need) return GW_EREGION;
    memset(base, 0, need);
    uint64_t *hdr = word_at(base, 0);
    hdr[1] = capacity;
    hdr[2] = SLOT_BYTES;
    __atomic_store_n(&hdr[0], MAGIC, __ATOMIC_RELEASE); /* published last: attachers see a whole header */
    return GW_OK;
}

/* The capacity of a valid region, or 0. Re-validated on every call so that a corrupted header can never
 * send an index past `size`. */
static uint64_t region_capacity(const char *base, size_t size) {
    if (base == NULL || ((uintptr_t)base & 7) != 0 || size < SLOT_BYTES) return 0;
    const uint64_t *hdr = word_at(base, 0);
    if (__atomic_load_n(&hdr[0], __ATOMIC_ACQUIRE) != MAGIC) return 0;
    uint64_t capacity = __atomic_load_n(&hdr[1], __ATOMIC_RELAXED);
    uint64_t need = gw_bt_region_size(capacity);
    return (need != 0 && need <= size) ? capacity : 0;
}

int64_t gw_bt_capacity(const char *base, size_t size) {
    uint64_t capacity = region_capacity(base, size);
    return capacity ? (int64_t)capacity : GW_EREGION;
}

/* splitmix64's finaliser: callers' keys are hashes already, but tests and careless callers use small
 * integers, which would otherwise cluster. */
static uint64_t mix(uint64_t x) {
    x ^= x >> 30;
    x *= UINT64_C(0xbf58476d1ce4e5b9);
    x ^= x >> 27;
    x *= UINT64_C(0x94d049bb133111eb);
    x ^= x >> 31;
    return x;
}

/* The slot of `key`: claimed if `claim` and absent. NULL with *err set when absent (err = GW_OK) or when
 * the table is full (GW_EFULL). */
static uint64_t *find_slot(const char *base, uint64_t capacity, uint64_t key, int claim, int *err) {
    uint64_t mask = capacity - 1;
    uint64_t start = mix(key) & mask;
    for (uint64_t probe = 0; probe < capacity; probe++) {
        uint64_t *slot = word_at(base, SLOT_BYTES * (1 + ((start + probe) & mask)));
        uint64_t seen = __atomic_load_n(&slot[W_KEY], __ATOMIC_ACQUIRE);
        if (seen == 0) {
            if (!claim) {
                *err = GW_OK; /* slots are never freed, so the key cannot be further along */
                return NULL;
            }
            if (__atomic_compare_exchange_n(&slot[W_KEY], &seen, key, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
                return slot;
            /* Lost the race for this slot; `seen` is now the winner's key, which may be ours. */
        }
        if (seen == key) return slot;
    }
    *err = claim ? GW_EFULL : GW_OK;
    return NULL;
}

/* ---- GCRA -------------------------------------------------------------------------------------------- */

static int64_t emission_interval(double rate_per_s) {
    double t = 1e9 / rate_per_s;
    if (!(t < (double)SPAN_MAX)) return SPAN_MAX;
    int64_t ns = (int64_t)(t + 0.5);
    return ns < 1 ? 1 : ns; /* rates above 1e9 per second behave as 1e9 */
}

static int64_t mul_sat(int64_t units, int64_t interval) { /* both >= 0, interval >= 1 */
    return units > SPAN_MAX / interval ? SPAN_MAX : units * interval;
}

static int64_t add_sat(int64_t t, int64_t span) { /* t in [0, TIME_MAX], span in [0, SPAN_MAX] */
    int64_t sum = t + span;
    return sum > TIME_MAX ? TIME_MAX : sum;
}

/* A TAT as a time. Only this file writes TAT words, so they stay in [0, TIME_MAX]; the clamp makes even a
 * word scribbled over through the plain atomics safe to compute with. */
static int64_t as_time(uint64_t word) { return word > (uint64_t)TIME_MAX ? TIME_MAX : (int64_t)word; }

static int valid_rate(double rate_per_s) { return rate_per_s > 0 && isfinite(rate_per_s); }

static int64_t resolve_now(int64_t now_ns) {
    int64_t now = now_ns < 0 ? gw_monotonic_ns() : now_ns;
    return now > TIME_MAX ? TIME_MAX : now;
}

/* Units admissible at `now` given a TAT, clamped to [0, burst]. */
static int64_t remaining_at(int64_t tat, int64_t now, int64_t tolerance, int64_t interval, int64_t burst) {
    int64_t used = tat > now ? tat - now : 0;
    if (used >= tolerance) return 0;
    int64_t units = (tolerance - used) / interval;
    return units > burst ? burst : units;
}

static int take_in(char *base, uint64_t capacity, uint64_t key, double rate_per_s, int64_t burst, int64_t n,
                   int64_t now, int64_t *out) {
    int err = GW_OK;
    uint64_t *slot = find_slot(base, capacity, key, 1, &err);
    if (slot == NULL) return err;
    int64_t interval = emission_interval(rate_per_s);
    int64_t tolerance = mul_sat(burst, interval);
    int64_t cost = mul_sat(n, interval);
    uint64_t tat = __atomic_load_n(&slot[W_TAT], __ATOMIC_ACQUIRE);
    if (n > burst) {
        out[0] = -1;
        out[1] = remaining_at(as_time(tat), now, tolerance, interval, burst);
        return GW_TOO_LARGE;
    }
    for (;;) {
        int64_t old = as_time(tat);
        int64_t next = add_sat(old > now ? old : now, cost);
        if (next - now > tolerance) {
            /* Admissible once now' reaches next - tolerance: old >= now here because n <= burst. */
            out[0] = next - tolerance - now;
            out[1] = remaining_at(old, now, tolerance, interval, burst);
            return GW_REFUSED;
        }
        if (next == old ||
            __atomic_compare_exchange_n(&slot[W_TAT], &tat, (uint64_t)next, 1, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
            out[0] = 0;
            out[1] = remaining_at(next, now, tolerance, interval, burst);
            return GW_ADMITTED;
        }
    }
}

int gw_bt_take(char *base, size_t size, uint64_t key, double rate_per_s, int64_t burst, int64_t n,
               int64_t now_ns, int64_t *out) {
    if (out == NULL || key == 0 || !valid_rate(rate_per_s) || burst < 0 || n < 0) return GW_EINVAL;
    uint64_t capacity = region_capacity(base, size);
    if (capacity == 0) return GW_EREGION;
    return take_in(base, capacity, key, rate_per_s, burst, n, resolve_now(now_ns), out);
}

static int settle_in(char *base, uint64_t capacity, uint64_t key, double rate_per_s, int64_t delta, int64_t now) {
    int err = GW_OK;
    /* A refund to a bucket that was never charged has nothing to give back: do not claim a slot. */
    uint64_t *slot = find_slot(base, capacity, key, delta > 0, &err);
    if (slot == NULL) return err;
    int64_t span = mul_sat(delta < 0 ? -delta : delta, emission_interval(rate_per_s));
    uint64_t tat = __atomic_load_n(&slot[W_TAT], __ATOMIC_ACQUIRE);
    for (;;) {
        int64_t old = as_time(tat);
        int64_t next;
        if (delta >= 0) {
            next = add_sat(old > now ? old : now, span);
        } else {
            if (old <= now) return GW_OK; /* already full; a refund cannot add capacity beyond burst */
            next = old - span < now ? now : old - span;
        }
        if (next == old ||
            __atomic_compare_exchange_n(&slot[W_TAT], &tat, (uint64_t)next, 1, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE))
            return GW_OK;
    }
}

int gw_bt_settle(char *base, size_t size, uint64_t key, double rate_per_s, int64_t delta, int64_t now_ns) {
    if (key == 0 || !valid_rate(rate_per_s) || delta == INT64_MIN) return GW_EINVAL;
    uint64_t capacity = region_capacity(base, size);
    if (capacity == 0) return GW_EREGION;
    return settle_in(base, capacity, key, rate_per_s, delta, resolve_now(now_ns));
}

int gw_bt_peek(const char *base, size_t size, uint64_t key, double rate_per_s, int64_t burst,
               int64_t now_ns, int64_t *out) {
    if (out == NULL || key == 0 || !valid_rate(rate_per_s) || burst < 0) return GW_EINVAL;
    uint64_t capacity = region_capacity(base, size);
    if (capacity == 0) return GW_EREGION;
    int err = GW_OK;
    const uint64_t *slot = find_slot(base, capacity, key, 0, &err);
    int64_t now = resolve_now(now_ns);
    int64_t tat = slot ? as_time(__atomic_load_n(&slot[W_TAT], __ATOMIC_ACQUIRE)) : 0;
    int64_t interval = emission_interval(rate_per_s);
    out[0] = remaining_at(tat, now, mul_sat(burst, interval), interval, burst);
    out[1] = tat > now ? tat - now : 0;
    return GW_OK;
}

/* ---- concurrency gauges ------------------------------------------------------------------------------ */

static int acquire_in(char *base, uint64_t capacity, uint64_t key, int64_t limit) {
    int err = GW_OK;
    uint64_t *slot = find_slot(base, capacity, key, 1, &err);
    if (slot == NULL) return err;
    uint64_t seen = __atomic_load_n(&slot[W_GAUGE], __ATOMIC_ACQUIRE);
    for (;;) {
        if (limit <= 0 || seen >= (uint64_t)limit) return 0;
        if (__atomic_compare_exchange_n(&slot[W_GAUGE], &seen, seen + 1, 1, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            return 1;
    }
}

int gw_bt_acquire(char *base, size_t size, uint64_t key, int64_t limit) {
    if (key == 0) return GW_EINVAL;
    uint64_t capacity = region_capacity(base, size);
    if (capacity == 0) return GW_EREGION;
    return acquire_in(base, capacity, key, limit);
}

static int64_t release_in(char *base, uint64_t capacity, uint64_t key) {
    int err = GW_OK;
    uint64_t *slot = find_slot(base, capacity, key, 0, &err);
    if (slot == NULL) return 0;
    uint64_t seen = __atomic_load_n(&slot[W_GAUGE], __ATOMIC_ACQUIRE);
    for (;;) {
        if (seen == 0) return 0;
        if (__atomic_compare_exchange_n(&slot[W_GAUGE], &seen, seen - 1, 1, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            return (int64_t)(seen - 1);
    }
}

int64_t gw_bt_release(char *base, size_t size, uint64_t key) {
    if (key == 0) return GW_EINVAL;
    uint64_t capacity = region_capacity(base, size);
    if (capacity == 0) return GW_EREGION;
    return release_in(base, capacity, key);
}

int64_t gw_bt_gauge(const char *base, size_t size, uint64_t key) {
    if (key == 0) return GW_EINVAL;
    uint64_t capacity = region_capacity(base, size);
    if (capacity == 0) return GW_EREGION;
    int err = GW_OK;
    const uint64_t *slot = find_slot(base, capacity, key, 0, &err);
    return slot ? (int64_t)__atomic_load_n(&slot[W_GAUGE], __ATOMIC_ACQUIRE) : 0;
}

/* ---- budget spend -------------------------------------------------------------------------------------- */

static int spend_add_in(char *base, uint64_t capacity, uint64_t key, int64_t tokens, int64_t cost) {
    int err = GW_OK;
    uint64_t *slot = find_slot(base, capacity, key, 1, &err);
    if (slot == NULL) return err;
    /* Unsigned addition wraps without UB; the words are read back as two's complement. */
    __atomic_fetch_add(&slot[W_LIVE_TOKENS], (uint64_t)tokens, __ATOMIC_ACQ_REL);
    __atomic_fetch_add(&slot[W_LIVE_COST], (uint64_t)cost, __ATOMIC_ACQ_REL);
    return GW_OK;
}

int gw_bt_spend_add(char *base, size_t size, uint64_t key, int64_t tokens, int64_t cost) {
    if (key == 0) return GW_EINVAL;
    uint64_t capacity = region_capacity(base, size);
    if (capacity == 0) return GW_EREGION;
    return spend_add_in(base, capacity, key, tokens, cost);
}

int gw_bt_spend_set_base(char *base, size_t size, uint64_t key, int64_t tokens, int64_t cost) {
    if (key == 0) return GW_EINVAL;
    uint64_t capacity = region_capacity(base, size);
    if (capacity == 0) return GW_EREGION;
    int err = GW_OK;
    uint64_t *slot = find_slot(base, capacity, key, 1, &err);
    if (slot == NULL) return err;
    __atomic_store_n(&slot[W_BASE_TOKENS], (uint64_t)tokens, __ATOMIC_RELEASE);
    __atomic_store_n(&slot[W_BASE_COST], (uint64_t)cost, __ATOMIC_RELEASE);
    return GW_OK;
}

/* out[0..3] = live tokens, live cost, base tokens, base cost of a window (zeros when unknown). */
static void spend_read_in(const char *base, uint64_t capacity, uint64_t key, int64_t *out) {
    int err = GW_OK;
    const uint64_t *slot = find_slot(base, capacity, key, 0, &err);
    for (int i = 0; i < 4; i++)
        out[i] = slot ? (int64_t)__atomic_load_n(&slot[W_LIVE_TOKENS + i], __ATOMIC_ACQUIRE) : 0;
}

int gw_bt_spend_read(const char *base, size_t size, uint64_t key, int64_t *out) {
    if (out == NULL || key == 0) return GW_EINVAL;
    uint64_t capacity = region_capacity(base, size);
    if (capacity == 0) return GW_EREGION;
    spend_read_in(base, capacity, key, out);
    return GW_OK;
}

/* ---- notes and admission plans ------------------------------------------------------------------------- */

/* The note word `index` of a block at byte offset note_off in a notes region, or NULL when there is no
 * block (note_off < 0) or it would fall outside the region. */
static uint64_t *note_word(char *notes, size_t notes_size, int64_t note_off, int64_t index) {
    if (notes == NULL || note_off < 0 || (note_off & 7) != 0 || ((uintptr_t)notes & 7) != 0) return NULL;
    uint64_t at = (uint64_t)note_off + 8 * (uint64_t)index;
    if (at + 8 > notes_size) return NULL;
    return word_at(notes, at);
}

static void note_set(char *notes, size_t notes_size, int64_t note_off, int64_t index, uint64_t key) {
    uint64_t *w = note_word(notes, notes_size, note_off, index);
    if (w != NULL) __atomic_store_n(w, key, __ATOMIC_SEQ_CST);
}

int gw_bt_enter(char *base, size_t size, uint64_t key, int64_t limit, char *notes, size_t notes_size,
                int64_t note_off) {
    if (key == 0) return GW_EINVAL;
    uint64_t capacity = region_capacity(base, size);
    if (capacity == 0) return GW_EREGION;
    /* Noted before it is taken: a crash in between makes the successor release a place that was never
     * taken (briefly admitting one more), never leak one for good. */
    note_set(notes, notes_size, note_off, 0, key);
    int rc = acquire_in(base, capacity, key, limit);
    if (rc != 1) note_set(notes, notes_size, note_off, 0, 0);
    return rc;
}

int64_t gw_bt_leave(char *base, size_t size, uint64_t key, char *notes, size_t notes_size, int64_t note_off) {
    if (key == 0) return GW_EINVAL;
    uint64_t capacity = region_capacity(base, size);
    if (capacity == 0) return GW_EREGION;
    int64_t left = release_in(base, capacity, key);
    note_set(notes, notes_size, note_off, 0, 0);
    return left;
}

static int64_t units_of(const gw_limit *limit, int64_t tokens) {
    if (limit->kind != GW_LIMIT_TOKENS) return 1;
    return tokens < limit->limit ? tokens : limit->limit; /* bigger than the burst still fits an empty bucket */
}

/* Give back what limits[0, upto) took for one request (gauges: their places and notes). */
static void undo(char *base, uint64_t capacity, const gw_limit *limits, int64_t upto, int64_t tokens,
                 char *notes, size_t notes_size, int64_t note_off, int64_t now) {
    int64_t gauge = 0;
    for (int64_t i = 0; i < upto; i++) {
        const gw_limit *l = &limits[i];
        if (l->kind == GW_LIMIT_CONCURRENCY) {
            release_in(base, capacity, l->key);
            note_set(notes, notes_size, note_off, gauge++, 0);
        } else {
            settle_in(base, capacity, l->key, l->rate_per_s, -units_of(l, tokens), now);
        }
    }
}

static int valid_plan(const gw_limit *limits, int64_t n) {
    if (n < 0 || n > GW_PLAN_MAX || (n > 0 && limits == NULL)) return 0;
    for (int64_t i = 0; i < n; i++) {
        const gw_limit *l = &limits[i];
        if (l->key == 0 || l->limit < 0) return 0;
        if (l->kind == GW_LIMIT_CONCURRENCY) continue;
        if ((l->kind != GW_LIMIT_REQUESTS && l->kind != GW_LIMIT_TOKENS) || !valid_rate(l->rate_per_s)) return 0;
    }
    return 1;
}

static int valid_windows(const gw_window *windows, int64_t nw) {
    if (nw < 0 || nw > GW_PLAN_MAX || (nw > 0 && windows == NULL)) return 0;
    for (int64_t i = 0; i < nw; i++)
        if (windows[i].key == 0) return 0;
    return 1;
}

int gw_bt_admit(char *base, size_t size, const gw_window *windows, int64_t nw, const gw_limit *limits,
                int64_t n, int64_t tokens, char *notes, size_t notes_size, int64_t note_off, int64_t now_ns,
                int64_t *out) {
    if (out == NULL || tokens < 0 || !valid_plan(limits, n) || !valid_windows(windows, nw)) return GW_EINVAL;
    uint64_t capacity = region_capacity(base, size);
    if (capacity == 0) return GW_EREGION;
    /* Budgets first: they take nothing, so a request they refuse leaves every bucket as it was. */
    for (int64_t i = 0; i < nw; i++) {
        const gw_window *w = &windows[i];
        int64_t spend[4];
        spend_read_in(base, capacity, w->key, spend);
        /* Unsigned addition wraps without UB, as the words themselves do. */
        int64_t used_tokens = (int64_t)((uint64_t)spend[0] + (uint64_t)spend[2]);
        int64_t used_cost = (int64_t)((uint64_t)spend[1] + (uint64_t)spend[3]);
        if ((w->tokens >= 0 && used_tokens >= w->tokens) || (w->cost >= 0 && used_cost >= w->cost)) {
            out[0] = i;
            out[1] = used_tokens;
            out[2] = used_cost;
            return GW_OVER_BUDGET;
        }
    }
    int64_t now = resolve_now(now_ns);
    out[0] = -1;
    out[1] = 0;
    out[2] = -1;
    out[3] = 0;
    out[4] = -1;
    out[5] = 0;
    int64_t gauge = 0;
    for (int64_t i = 0; i < n; i++) {
        const gw_limit *l = &limits[i];
        int rc;
        if (l->kind == GW_LIMIT_CONCURRENCY) {
            note_set(notes, notes_size, note_off, gauge, l->key);
            rc = acquire_in(base, capacity, l->key, l->limit);
            if (rc == 0) note_set(notes, notes_size, note_off, gauge, 0);
            if (rc == 1) {
                gauge++;
                continue;
            }
            if (rc == 0) out[1] = 1000000000; /* a place frees when a request ends: try again in a second */
        } else {
            int64_t got[2];
            rc = take_in(base, capacity, l->key, l->rate_per_s, l->limit, units_of(l, tokens), now, got);
            if (rc == GW_ADMITTED) {
                int64_t *tight = l->kind == GW_LIMIT_TOKENS ? &out[4] : &out[2];
                if (tight[0] < 0 || got[1] < tight[1]) {
                    tight[0] = i;
                    tight[1] = got[1];
                }
                continue;
            }
            if (rc == GW_REFUSED) out[1] = got[0];
            if (rc == GW_TOO_LARGE) rc = GW_REFUSED, out[1] = -1;
        }
        undo(base, capacity, limits, i, tokens, notes, notes_size, note_off, now);
        if (rc < 0) return rc;
        out[0] = i;
        return GW_REFUSED;
    }
    return GW_ADMITTED;
}

int gw_bt_finish(char *base, size_t size, const gw_limit *limits, int64_t n, int64_t tokens, int64_t used,
                 char *notes, size_t notes_size, int64_t note_off, const gw_window *windows, int64_t nw,
                 int64_t spend_tokens, int64_t spend_cost, int64_t now_ns) {
    if (tokens < 0 || !valid_plan(limits, n) || !valid_windows(windows, nw)) return GW_EINVAL;
    uint64_t capacity = region_capacity(base, size);
    if (capacity == 0) return GW_EREGION;
    int64_t now = resolve_now(now_ns);
    int64_t gauge = 0;
    for (int64_t i = 0; i < n; i++) {
        const gw_limit *l = &limits[i];
        if (l->kind == GW_LIMIT_CONCURRENCY) {
            release_in(base, capacity, l->key);
            note_set(notes, notes_size, note_off, gauge++, 0);
        } else if (l->kind == GW_LIMIT_TOKENS && used >= 0) {
            int64_t delta = used - units_of(l, tokens);
            if (delta != 0) settle_in(base, capacity, l->key, l->rate_per_s, delta, now);
        }
    }
    if (spend_tokens == 0 && spend_cost == 0) return (int)nw;
    for (int64_t i = 0; i < nw; i++)
        if (spend_add_in(base, capacity, windows[i].key, spend_tokens, spend_cost) != GW_OK) return (int)i;
    return (int)nw;
}
