/*
 * prefix_index.c: which backend was sent which prompt blocks, in a region that a host's proxy workers share.
 *
 * A prompt is cut into fixed-size blocks whose hashes are chained (each block's hash covers every byte
 * before it), so one hash names a whole prefix, the way an engine's prefix cache names its KV blocks. The
 * index remembers (block hash, backend) pairs: a backend "holds" a prefix of n blocks when the pairs of
 * all n are present. It is a bounded cache, like the engines' own: a set-associative table of `entries`
 * slots in sets of WAYS, each slot a key and the stamp of its last use; a new pair takes a free way of its
 * set or the least recently used one. It also counts the pairs each target holds (what an engine's cache
 * holds of what it was sent, as far as the index knows): where a prompt matches nowhere, the target that
 * holds least has the most room for it.
 *
 * The same table can hold exact pairs: what an engine's published KV events say it caches (the host's
 * control slot writes them, gateway/routing/kv_mirror.py). They are inserted pinned, so that the noting of
 * prompts sent never pushes them out while a set has an unpinned way (only a set full of pinned pairs
 * gives up its oldest), and they leave when the engine says so: gw_pix_forget removes named pairs,
 * gw_pix_forget_target every pair of one target.
 *
 * Region layout (little-endian host uint64 words, the region 8-aligned):
 *   header, 64 bytes: [0] magic, [1] entries (a power of two), [2] secret (seeds the block hashes),
 *     [3] clock (one tick per insert call), [4] inserts, [5] evictions, [6] routing decisions that took a
 *     target's prefix from exact pairs, [7] of those, the ones where the exact pairs held a block
 *   TARGETS target slots of 16 bytes: [0] target (0 = free; claimed once), [1] pairs it holds
 *   entries slots of 16 bytes: [0] key (0 = free), [1] stamp: the clock when last inserted << 9, bit 8
 *     set for a pinned pair, and the target slot of the pair in the low 8 bits
 *
 * Workers read and write without locks: each word is loaded and stored atomically, and a race between two
 * writers of one slot loses at most one pair, which costs one routing hint, never a wrong read past the
 * region. No allocation, no I/O.
 */
#include <string.h>

#include "gateway_native.h"

#define MAGIC UINT64_C(0x31305849504757) /* "WGPIX01" */
#define HEADER_WORDS 8
#define TARGETS 256 /* targets counted; more share the last slot's count */
#define TARGET_WORDS (2 * TARGETS)
#define TABLE_WORDS (HEADER_WORDS + TARGET_WORDS)
#define WAYS 8
#define MIN_ENTRIES WAYS
#define MAX_ENTRIES (UINT64_C(1) << 28)
#define H_MAGIC 0
#define H_ENTRIES 1
#define H_SECRET 2
#define H_CLOCK 3
#define H_INSERTS 4
#define H_EVICTIONS 5
#define H_EXACT 6
#define H_EXACT_HELD 7
#define PINNED (UINT64_C(1) << 8)
#define CLOCK_SHIFT 9

static uint64_t *words(const char *base) { return (uint64_t *)(uintptr_t)base; }

static uint64_t load(const uint64_t *w) { return __atomic_load_n(w, __ATOMIC_RELAXED); }

static void store(uint64_t *w, uint64_t v) { __atomic_store_n(w, v, __ATOMIC_RELAXED); }

uint64_t gw_pix_region_size(uint64_t entries) {
    if (entries < MIN_ENTRIES || entries > MAX_ENTRIES || (entries & (entries - 1)) != 0) return 0;
    return TABLE_WORDS * 8 + entries * 16;
}

/* block_hash chained from `h` over data's whole blocks, at most max_out of them. */
static uint32_t chain_blocks(uint64_t h, const char *data, size_t len, uint32_t block, uint64_t *out,
                             uint32_t max_out);

int gw_pix_init(char *base, size_t size, uint64_t entries, uint64_t secret) {
    uint64_t need = gw_pix_region_size(entries);
    if (need == 0) return GW_EINVAL;
    if (base == NULL || ((uintptr_t)base & 7) != 0 || size < need) return GW_EREGION;
    memset(base, 0, need);
    uint64_t *hdr = words(base);
    hdr[H_ENTRIES] = entries;
    hdr[H_SECRET] = secret;
    __atomic_store_n(&hdr[H_MAGIC], MAGIC, __ATOMIC_RELEASE); /* published last */
    return GW_OK;
}

/* The entries of a valid region, or 0; re-validated on every call so that a scribbled header can never send
 * an index past `size`. */
static uint64_t region_entries(const char *base, size_t size) {
    if (base == NULL || ((uintptr_t)base & 7) != 0 || size < TABLE_WORDS * 8) return 0;
    const uint64_t *hdr = words(base);
    if (__atomic_load_n(&hdr[H_MAGIC], __ATOMIC_ACQUIRE) != MAGIC) return 0;
    uint64_t entries = hdr[H_ENTRIES];
    uint64_t need = gw_pix_region_size(entries);
    return (need != 0 && need <= size) ? entries : 0;
}

int64_t gw_pix_entries(const char *base, size_t size) {
    uint64_t entries = region_entries(base, size);
    return entries ? (int64_t)entries : GW_EREGION;
}

/* ---- hashing ------------------------------------------------------------------------------------------ */

#define K0 UINT64_C(0xa0761d6478bd642f)
#define K1 UINT64_C(0xe7037ed1a0b428db)
#define K2 UINT64_C(0x8ebc6af09c88c6e3)

/* Multiply and fold (wyhash's mixing step): every input bit reaches every output bit in one step. */
static uint64_t mum(uint64_t a, uint64_t b) {
    __uint128_t r = (__uint128_t)a * b;
    return (uint64_t)(r >> 64) ^ (uint64_t)r;
}

static uint64_t read64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* One block's hash, chained to the hash of everything before it. */
static uint64_t block_hash(const unsigned char *p, size_t len, uint64_t prev) {
    uint64_t h = prev ^ K0;
    size_t i = 0;
    for (; i + 16 <= len; i += 16) h = mum(read64(p + i) ^ K1 ^ h, read64(p + i + 8) ^ K2);
    unsigned char tail[16] = {0};
    memcpy(tail, p + i, len - i);
    h = mum(read64(tail) ^ K1 ^ h, read64(tail + 8) ^ K2 ^ (uint64_t)(len - i));
    return mum(h ^ (uint64_t)len, K1 ^ K2);
}

int64_t gw_pix_hash_blocks(const char *base, size_t size, const char *data, size_t len, uint32_t block,
                           uint64_t *out, uint32_t max_out) {
    if (region_entries(base, size) == 0) return GW_EREGION;
    if (block == 0 || (data == NULL && len > 0) || (out == NULL && max_out > 0)) return GW_EINVAL;
    return chain_blocks(words(base)[H_SECRET], data, len, block, out, max_out);
}

int64_t gw_pix_hash_after(const char *base, size_t size, uint64_t prev, const char *data, size_t len,
                          uint32_t block, uint64_t *out, uint32_t max_out) {
    if (region_entries(base, size) == 0) return GW_EREGION;
    if (block == 0 || (data == NULL && len > 0) || (out == NULL && max_out > 0)) return GW_EINVAL;
    return chain_blocks(prev, data, len, block, out, max_out);
}

static uint32_t chain_blocks(uint64_t h, const char *data, size_t len, uint32_t block, uint64_t *out,
                             uint32_t max_out) {
    size_t full = len / block;
    uint32_t n = full < max_out ? (uint32_t)full : max_out;
    const unsigned char *p = (const unsigned char *)data;
    for (uint32_t i = 0; i < n; i++) {
        h = block_hash(p + (size_t)i * block, block, h);
        out[i] = h;
    }
    return n;
}

/* ---- the table ---------------------------------------------------------------------------------------- */

/* The slot key of (block hash, target): never 0, which marks a free slot. */
static uint64_t pair_key(uint64_t hash, uint64_t target) {
    uint64_t k = mum(hash ^ K0, target ^ K1);
    return k ? k : 1;
}

static uint64_t *set_of(const char *base, uint64_t entries, uint64_t key) {
    uint64_t sets = entries / WAYS;
    /* The low bits of a folded product are as good as the high; the high ones are kept for nothing. */
    return words(base) + TABLE_WORDS + 2 * WAYS * (key & (sets - 1));
}

/* The slot counting `target`'s pairs, claimed on first use (when `claim`); -1 when it has none. Probes
 * from a mix of the target; a full table shares its last slot. */
static int target_slot(const char *base, uint64_t target, int claim) {
    uint64_t *slots = words(base) + HEADER_WORDS;
    uint64_t want = target ? target : 1;
    for (int probe = 0; probe < TARGETS; probe++) {
        int s = (int)((mum(want, K2) + (uint64_t)probe) & (TARGETS - 1));
        uint64_t k = __atomic_load_n(&slots[2 * s], __ATOMIC_ACQUIRE);
        if (k == want) return s;
        if (k == 0) {
            if (!claim) return -1;
            uint64_t expected = 0;
            if (__atomic_compare_exchange_n(&slots[2 * s], &expected, want, 0, __ATOMIC_ACQ_REL,
                                            __ATOMIC_ACQUIRE))
                return s;
            if (expected == want) return s;
        }
    }
    return claim ? TARGETS - 1 : -1;
}

static void add_held(const char *base, int slot, int64_t delta) {
    if (delta) __atomic_add_fetch(words(base) + HEADER_WORDS + 2 * slot + 1, (uint64_t)delta, __ATOMIC_RELAXED);
}

int64_t gw_pix_held(const char *base, size_t size, uint64_t target) {
    if (region_entries(base, size) == 0) return GW_EREGION;
    int s = target_slot(base, target, 0);
    if (s < 0) return 0;
    int64_t held = (int64_t)load(words(base) + HEADER_WORDS + 2 * s + 1);
    return held > 0 ? held : 0; /* racing writers may leave it a little off, never below nothing */
}

static int holds(const uint64_t *set, uint64_t key) {
    for (int w = 0; w < WAYS; w++)
        if (load(&set[2 * w]) == key) return 1;
    return 0;
}

int64_t gw_pix_match(const char *base, size_t size, const uint64_t *hashes, uint32_t n, uint64_t target) {
    uint64_t entries = region_entries(base, size);
    if (entries == 0) return GW_EREGION;
    if (hashes == NULL && n > 0) return GW_EINVAL;
    uint32_t i = 0;
    for (; i < n; i++) {
        uint64_t key = pair_key(hashes[i], target);
        if (!holds(set_of(base, entries, key), key)) break;
    }
    return i;
}

int64_t gw_pix_insert(char *base, size_t size, const uint64_t *hashes, uint32_t n, uint64_t target) {
    return gw_pix_insert_pinned(base, size, hashes, n, target, 0);
}

int64_t gw_pix_insert_pinned(char *base, size_t size, const uint64_t *hashes, uint32_t n, uint64_t target,
                             int pinned) {
    uint64_t entries = region_entries(base, size);
    if (entries == 0) return GW_EREGION;
    if (hashes == NULL && n > 0) return GW_EINVAL;
    uint64_t *hdr = words(base);
    uint64_t now = __atomic_add_fetch(&hdr[H_CLOCK], 1, __ATOMIC_RELAXED);
    int mine = target_slot(base, target, 1);
    uint64_t stamp = (now << CLOCK_SHIFT) | (pinned ? PINNED : 0) | (uint64_t)mine;
    uint64_t evicted = 0;
    int64_t added = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t key = pair_key(hashes[i], target);
        uint64_t *set = set_of(base, entries, key);
        int pick = -1;
        int pick_pinned = 1;
        uint64_t oldest_age = 0;
        for (int w = 0; w < WAYS; w++) {
            uint64_t k = load(&set[2 * w]);
            if (k == key) {
                pick = w;
                break;
            }
            /* A free way is as old as can be; ages are differences, so the clock may wrap. An unpinned
             * way goes before any pinned one. */
            uint64_t st = load(&set[2 * w + 1]);
            int is_pinned = k != 0 && (st & PINNED) != 0;
            uint64_t age = k == 0 ? UINT64_MAX : (now - (st >> CLOCK_SHIFT)) & (UINT64_MAX >> CLOCK_SHIFT);
            if (pick < 0 || is_pinned < pick_pinned || (is_pinned == pick_pinned && age > oldest_age)) {
                pick = w;
                pick_pinned = is_pinned;
                oldest_age = age;
            }
        }
        uint64_t *slot = &set[2 * pick];
        uint64_t was = load(slot);
        if (was != key) {
            if (was != 0) {
                evicted++;
                add_held(base, (int)(load(slot + 1) & 0xff), -1);
            }
            store(slot, key);
            added++;
        }
        store(slot + 1, stamp);
    }
    add_held(base, mine, added);
    __atomic_add_fetch(&hdr[H_INSERTS], n, __ATOMIC_RELAXED);
    if (evicted) __atomic_add_fetch(&hdr[H_EVICTIONS], evicted, __ATOMIC_RELAXED);
    return evicted;
}

/* Clear the slot of one pair if it holds `key`; 1 if it did. */
static int64_t clear_pair(char *base, uint64_t entries, uint64_t key) {
    uint64_t *set = set_of(base, entries, key);
    for (int w = 0; w < WAYS; w++) {
        uint64_t *slot = &set[2 * w];
        if (load(slot) == key) {
            uint64_t stamp = load(slot + 1);
            uint64_t expected = key;
            /* A writer that took the slot meanwhile keeps it: its pair is not ours to clear. */
            if (__atomic_compare_exchange_n(slot, &expected, 0, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
                add_held(base, (int)(stamp & 0xff), -1);
                return 1;
            }
        }
    }
    return 0;
}

int64_t gw_pix_forget(char *base, size_t size, const uint64_t *hashes, uint32_t n, uint64_t target) {
    uint64_t entries = region_entries(base, size);
    if (entries == 0) return GW_EREGION;
    if (hashes == NULL && n > 0) return GW_EINVAL;
    int64_t removed = 0;
    for (uint32_t i = 0; i < n; i++) removed += clear_pair(base, entries, pair_key(hashes[i], target));
    return removed;
}

int64_t gw_pix_forget_target(char *base, size_t size, uint64_t target) {
    uint64_t entries = region_entries(base, size);
    if (entries == 0) return GW_EREGION;
    int s = target_slot(base, target, 0);
    if (s < 0) return 0;
    /* A slot records only its pair's target slot, not the target: past TARGETS targets the last slot is
     * shared, and forgetting one of them forgets them all (the pairs of a forgotten target come back
     * from their own events or prompts). */
    uint64_t *table = words(base) + TABLE_WORDS;
    int64_t removed = 0;
    for (uint64_t i = 0; i < entries; i++) {
        uint64_t *slot = &table[2 * i];
        uint64_t key = load(slot);
        if (key == 0 || (load(slot + 1) & 0xff) != (uint64_t)s) continue;
        uint64_t expected = key;
        if (__atomic_compare_exchange_n(slot, &expected, 0, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) removed++;
    }
    add_held(base, s, -removed);
    return removed;
}

int gw_pix_count_exact(char *base, size_t size, int held) {
    if (region_entries(base, size) == 0) return GW_EREGION;
    uint64_t *hdr = words(base);
    __atomic_add_fetch(&hdr[H_EXACT], 1, __ATOMIC_RELAXED);
    if (held) __atomic_add_fetch(&hdr[H_EXACT_HELD], 1, __ATOMIC_RELAXED);
    return GW_OK;
}

int gw_pix_stats(const char *base, size_t size, uint64_t *out) {
    if (region_entries(base, size) == 0) return GW_EREGION;
    if (out == NULL) return GW_EINVAL;
    const uint64_t *hdr = words(base);
    out[0] = load(&hdr[H_CLOCK]);
    out[1] = load(&hdr[H_INSERTS]);
    out[2] = load(&hdr[H_EVICTIONS]);
    out[3] = load(&hdr[H_EXACT]);
    out[4] = load(&hdr[H_EXACT_HELD]);
    return GW_OK;
}
