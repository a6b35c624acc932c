/*
 * usage_ring.c: single-producer/single-consumer rings of small records (usage records) in a region that
 * forked worker processes share. Ring i has one producer (proxy worker i, or its respawned successor) and
 * all rings have one consumer (the control worker).
 *
 * Region layout (words are host-order uint64, the region 8-aligned):
 *   header, 64 bytes: [0] magic, [1] rings, [2] slots per ring (a power of two), [3] slot bytes, [4..7] 0
 *   then per ring, at 64 + ring * (128 + slots * slot_bytes):
 *     control block, 128 bytes: head at +0 and dropped at +8 (the producer's cache line, written by
 *                               the producer only), tail at +64 (its own cache line, the consumer's)
 *     slots * slot_bytes bytes of slots; a slot (slot_bytes a multiple of 64) is
 *       [uint32 length][uint32 marker][payload: length <= slot_bytes - 8 bytes]
 *     where the marker is 0 for a record pushed whole into one slot (gw_ring_push), and the slots left in
 *     its record for a record spanning slots (gw_ring_push_span)
 *
 * head and tail are free-running counters (records ever pushed / ever consumed); a counter's slot is
 * counter & (slots - 1), and head - tail records are pending. The producer copies a record into slot head
 * and only then publishes head + 1 with release, so a producer killed mid-push leaves nothing visible and
 * its successor (which continues from the head in the region) overwrites the half-written slot. The
 * consumer reads pending slots without consuming them and advances tail (release) once it is done with
 * them, so a consumer that dies in between re-reads the same records. Neither side ever waits for the
 * other: a full ring is reported to the producer, which decides what to do.
 *
 * A ring may also carry records longer than a slot (body logs): gw_ring_push_span copies one across
 * consecutive slots, each slot's marker counting the slots left in its record (k, k - 1, ..., 1),
 * and publishes them with one head store, so a record is seen whole or not at all; gw_ring_read_spans
 * joins them again. A producer of spans counts the records it could not push (no room, or longer than the
 * whole ring) in the word after its head, where they survive a respawn of the producer.
 *
 * The header is re-validated on every call, and lengths read back from slots are clamped, so a region
 * scribbled over can yield wrong records but never a read or write outside [base, base + size).
 * No allocation, no I/O, no system calls.
 */
#include <string.h>

#include "gateway_native.h"

#define MAGIC UINT64_C(0x3130474E52574747) /* "GGWRNG01" */
#define HEADER_BYTES 64
#define CONTROL_BYTES 128
#define TAIL_OFFSET 64
#define DROPPED_OFFSET 8 /* in the producer's cache line: only the producer writes it */
#define SLOT_HEADER_BYTES 8
#define MAX_RINGS 4096
#define MIN_SLOTS 2
#define MAX_SLOTS (UINT64_C(1) << 20)
#define MIN_SLOT_BYTES 64
#define MAX_SLOT_BYTES 65536

typedef struct {
    uint64_t rings;
    uint64_t slots;
    uint64_t slot_bytes;
} geometry;

static uint64_t *word_at(const char *base, uint64_t off) { return (uint64_t *)(uintptr_t)(base + off); }

/* ---- region ------------------------------------------------------------------------------------------ */

static uint64_t ring_stride(uint64_t slots, uint64_t slot_bytes) {
    return CONTROL_BYTES + slots * slot_bytes;
}

uint64_t gw_ring_region_size(uint64_t rings, uint64_t slots, uint64_t slot_bytes) {
    if (rings == 0 || rings > MAX_RINGS) return 0;
    if (slots < MIN_SLOTS || slots > MAX_SLOTS || (slots & (slots - 1)) != 0) return 0;
    if (slot_bytes < MIN_SLOT_BYTES || slot_bytes > MAX_SLOT_BYTES || slot_bytes % 64 != 0) return 0;
    /* At most 64 + 4096 * (128 + 2^36) < 2^49: no overflow. */
    return HEADER_BYTES + rings * ring_stride(slots, slot_bytes);
}

int gw_ring_init(char *base, size_t size, uint64_t rings, uint64_t slots, uint64_t slot_bytes) {
    uint64_t need = gw_ring_region_size(rings, slots, slot_bytes);
    if (need == 0) return GW_EINVAL;
    if (base == NULL || ((uintptr_t)base & 7) != 0 || size < need) return GW_EREGION;
    memset(base, 0, need);
    uint64_t *hdr = word_at(base, 0);
    hdr[1] = rings;
    hdr[2] = slots;
    hdr[3] = slot_bytes;
    __atomic_store_n(&hdr[0], MAGIC, __ATOMIC_RELEASE); /* published last: attachers see a whole header */
    return GW_OK;
}

/* Fill *g from a valid region and return 1, or return 0. Re-validated on every call so that a corrupted
 * header can never send an offset past `size`. */
static int region_geometry(const char *base, size_t size, geometry *g) {
    if (base == NULL || ((uintptr_t)base & 7) != 0 || size < HEADER_BYTES) return 0;
    const uint64_t *hdr = word_at(base, 0);
    if (__atomic_load_n(&hdr[0], __ATOMIC_ACQUIRE) != MAGIC) return 0;
    g->rings = __atomic_load_n(&hdr[1], __ATOMIC_RELAXED);
    g->slots = __atomic_load_n(&hdr[2], __ATOMIC_RELAXED);
    g->slot_bytes = __atomic_load_n(&hdr[3], __ATOMIC_RELAXED);
    uint64_t need = gw_ring_region_size(g->rings, g->slots, g->slot_bytes);
    return need != 0 && need <= size;
}

int gw_ring_geometry(const char *base, size_t size, uint64_t *out) {
    geometry g;
    if (!region_geometry(base, size, &g)) return GW_EREGION;
    if (out == NULL) return GW_EINVAL;
    out[0] = g.rings;
    out[1] = g.slots;
    out[2] = g.slot_bytes;
    return GW_OK;
}

/* The control block of `ring` (ring < g->rings). */
static uint64_t control_offset(const geometry *g, uint64_t ring) {
    return HEADER_BYTES + ring * ring_stride(g->slots, g->slot_bytes);
}

static uint64_t slot_offset(const geometry *g, uint64_t control, uint64_t counter) {
    return control + CONTROL_BYTES + (counter & (g->slots - 1)) * g->slot_bytes;
}

/* Records published and not yet consumed. A scribbled-over pair of counters can claim more than a ring
 * holds (or a tail beyond the head, which wraps to a huge difference); clamp to the ring. */
static uint64_t pending_of(const geometry *g, uint64_t head, uint64_t tail) {
    uint64_t pending = head - tail;
    return pending > g->slots ? g->slots : pending;
}

/* ---- producer ---------------------------------------------------------------------------------------- */

int gw_ring_push(char *base, size_t size, uint64_t ring, const char *data, size_t len) {
    geometry g;
    if (!region_geometry(base, size, &g)) return GW_EREGION;
    if (ring >= g.rings || len > g.slot_bytes - SLOT_HEADER_BYTES || (data == NULL && len != 0))
        return GW_EINVAL;
    uint64_t control = control_offset(&g, ring);
    uint64_t *head_word = word_at(base, control);
    uint64_t *tail_word = word_at(base, control + TAIL_OFFSET);
    /* Acquire: the consumer is done reading every slot below tail before we overwrite one of them. */
    uint64_t tail = __atomic_load_n(tail_word, __ATOMIC_ACQUIRE);
    /* Relaxed: only this process writes head (a respawned producer's predecessor is dead by then). */
    uint64_t head = __atomic_load_n(head_word, __ATOMIC_RELAXED);
    if (head - tail >= g.slots) return 0;
    char *slot = base + slot_offset(&g, control, head);
    uint32_t header[2] = {(uint32_t)len, 0};
    memcpy(slot, header, sizeof header);
    if (len != 0) memcpy(slot + SLOT_HEADER_BYTES, data, len);
    /* Release: the slot's bytes are visible to whoever sees the new head. Published only after the copy,
     * so a producer killed before this line leaves no record behind. */
    __atomic_store_n(head_word, head + 1, __ATOMIC_RELEASE);
    return 1;
}

/* ---- consumer ---------------------------------------------------------------------------------------- */

int64_t gw_ring_read(const char *base, size_t size, uint64_t ring, char *out, size_t out_cap,
                     uint64_t max_records) {
    geometry g;
    if (!region_geometry(base, size, &g)) return GW_EREGION;
    if (ring >= g.rings || (out == NULL && out_cap != 0)) return GW_EINVAL;
    uint64_t control = control_offset(&g, ring);
    /* Acquire: every slot below head is completely written. */
    uint64_t head = __atomic_load_n(word_at(base, control), __ATOMIC_ACQUIRE);
    uint64_t tail = __atomic_load_n(word_at(base, control + TAIL_OFFSET), __ATOMIC_RELAXED);
    uint64_t pending = pending_of(&g, head, tail);
    uint64_t n = pending < max_records ? pending : max_records;
    uint64_t max_len = g.slot_bytes - SLOT_HEADER_BYTES;
    size_t used = 0;
    uint64_t i;
    for (i = 0; i < n; i++) {
        const char *slot = base + slot_offset(&g, control, tail + i);
        uint32_t len;
        memcpy(&len, slot, sizeof len);
        if (len > max_len) len = 0; /* corrupted: never read past the slot */
        if (out_cap - used < sizeof len || out_cap - used - sizeof len < len) break;
        memcpy(out + used, &len, sizeof len);
        if (len != 0) memcpy(out + used + sizeof len, slot + SLOT_HEADER_BYTES, len);
        used += sizeof len + len;
    }
    return (int64_t)i;
}

int gw_ring_advance(char *base, size_t size, uint64_t ring, uint64_t n) {
    geometry g;
    if (!region_geometry(base, size, &g)) return GW_EREGION;
    if (ring >= g.rings) return GW_EINVAL;
    uint64_t control = control_offset(&g, ring);
    uint64_t head = __atomic_load_n(word_at(base, control), __ATOMIC_ACQUIRE);
    uint64_t *tail_word = word_at(base, control + TAIL_OFFSET);
    uint64_t tail = __atomic_load_n(tail_word, __ATOMIC_RELAXED); /* only the consumer writes tail */
    if (n > pending_of(&g, head, tail)) return GW_EINVAL;
    /* Release: our reads of the consumed slots happen before the producer may overwrite them. */
    __atomic_store_n(tail_word, tail + n, __ATOMIC_RELEASE);
    return GW_OK;
}

int gw_ring_counters(const char *base, size_t size, uint64_t ring, uint64_t *out) {
    geometry g;
    if (!region_geometry(base, size, &g)) return GW_EREGION;
    if (ring >= g.rings || out == NULL) return GW_EINVAL;
    uint64_t control = control_offset(&g, ring);
    out[0] = __atomic_load_n(word_at(base, control), __ATOMIC_ACQUIRE);
    out[1] = __atomic_load_n(word_at(base, control + TAIL_OFFSET), __ATOMIC_ACQUIRE);
    return GW_OK;
}

/* ---- records spanning slots -------------------------------------------------------------------------- */

int gw_ring_push_span(char *base, size_t size, uint64_t ring, const char *data, size_t len) {
    geometry g;
    if (!region_geometry(base, size, &g)) return GW_EREGION;
    if (ring >= g.rings || (data == NULL && len != 0)) return GW_EINVAL;
    uint64_t payload = g.slot_bytes - SLOT_HEADER_BYTES;
    uint64_t need = len / payload + (len % payload != 0);
    if (need == 0) need = 1; /* an empty record still takes a slot */
    uint64_t control = control_offset(&g, ring);
    uint64_t *head_word = word_at(base, control);
    uint64_t *dropped_word = word_at(base, control + DROPPED_OFFSET);
    uint64_t tail = __atomic_load_n(word_at(base, control + TAIL_OFFSET), __ATOMIC_ACQUIRE);
    uint64_t head = __atomic_load_n(head_word, __ATOMIC_RELAXED);
    uint64_t pending = head - tail;
    if (need > g.slots || pending > g.slots || need > g.slots - pending) {
        /* Relaxed: the count is this producer's alone; readers only report it. */
        __atomic_store_n(dropped_word, __atomic_load_n(dropped_word, __ATOMIC_RELAXED) + 1, __ATOMIC_RELAXED);
        return 0;
    }
    size_t done = 0;
    for (uint64_t i = 0; i < need; i++) {
        char *slot = base + slot_offset(&g, control, head + i);
        size_t part = len - done < payload ? len - done : (size_t)payload;
        uint32_t header[2] = {(uint32_t)part, (uint32_t)(need - i)};
        memcpy(slot, header, sizeof header);
        if (part != 0) memcpy(slot + SLOT_HEADER_BYTES, data + done, part);
        done += part;
    }
    /* Release, once for the whole record: the consumer never sees part of it. */
    __atomic_store_n(head_word, head + need, __ATOMIC_RELEASE);
    return 1;
}

/* The slots of the record starting `from` slots past tail, and its length, when its slots read as one
 * record (each marker one less than the one before, every fragment but the last full); 0 otherwise. */
static uint64_t span_at(const char *base, const geometry *g, uint64_t control, uint64_t tail, uint64_t from,
                        uint64_t available, uint64_t *len_out) {
    uint64_t payload = g->slot_bytes - SLOT_HEADER_BYTES;
    uint32_t header[2];
    memcpy(header, base + slot_offset(g, control, tail + from), sizeof header);
    uint64_t span = header[1] == 0 ? 1 : header[1]; /* 0: a slot pushed whole by gw_ring_push */
    if (span > available) return 0;
    uint64_t len = 0;
    for (uint64_t j = 0; j < span; j++) {
        memcpy(header, base + slot_offset(g, control, tail + from + j), sizeof header);
        uint64_t marker = header[1] == 0 ? 1 : header[1];
        if (marker != span - j || header[0] > payload || (j + 1 < span && header[0] != payload)) return 0;
        len += header[0];
    }
    *len_out = len;
    return span;
}

int64_t gw_ring_read_spans(const char *base, size_t size, uint64_t ring, char *out, size_t out_cap,
                           uint64_t max_records, uint64_t *slots_out) {
    geometry g;
    if (!region_geometry(base, size, &g)) return GW_EREGION;
    if (ring >= g.rings || (out == NULL && out_cap != 0) || slots_out == NULL) return GW_EINVAL;
    uint64_t control = control_offset(&g, ring);
    uint64_t head = __atomic_load_n(word_at(base, control), __ATOMIC_ACQUIRE);
    uint64_t tail = __atomic_load_n(word_at(base, control + TAIL_OFFSET), __ATOMIC_RELAXED);
    uint64_t pending = pending_of(&g, head, tail);
    uint64_t slots = 0, records = 0;
    size_t used = 0;
    while (records < max_records && slots < pending) {
        uint64_t len = 0;
        uint64_t span = span_at(base, &g, control, tail, slots, pending - slots, &len);
        if (span == 0) { /* scribbled over: one slot becomes an empty record, and reading resynchronises */
            span = 1;
            len = 0;
        }
        if (out_cap - used < sizeof(uint32_t) || out_cap - used - sizeof(uint32_t) < len) break;
        uint32_t total = (uint32_t)len;
        memcpy(out + used, &total, sizeof total);
        used += sizeof total;
        for (uint64_t j = 0; j < span && len != 0; j++) {
            const char *slot = base + slot_offset(&g, control, tail + slots + j);
            uint32_t part;
            memcpy(&part, slot, sizeof part);
            memcpy(out + used, slot + SLOT_HEADER_BYTES, part);
            used += part;
        }
        slots += span;
        records++;
    }
    *slots_out = slots;
    return (int64_t)records;
}

int gw_ring_dropped(const char *base, size_t size, uint64_t ring, uint64_t *out) {
    geometry g;
    if (!region_geometry(base, size, &g)) return GW_EREGION;
    if (ring >= g.rings || out == NULL) return GW_EINVAL;
    *out = __atomic_load_n(word_at(base, control_offset(&g, ring) + DROPPED_OFFSET), __ATOMIC_RELAXED);
    return GW_OK;
}
