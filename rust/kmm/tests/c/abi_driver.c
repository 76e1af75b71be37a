/* Drives libkmm's C ABI the way a C caller would: every call, valid and invalid arguments,
 * data verified, managers destroyed with buffers still live. Built with -Wall -Wextra -Werror
 * and run under Valgrind memcheck (tools/valgrind_c_abi.sh); exits non-zero on any mismatch. */
#include "kmm.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;
static unsigned long checks = 0;

#define EXPECT(call, want)                                                                   \
    do {                                                                                     \
        KmmStatus got_ = (call);                                                             \
        checks++;                                                                            \
        if (got_ != (want)) {                                                                \
            fprintf(stderr, "%s:%d: %s returned %s, expected %s (%s)\n", __FILE__, __LINE__, \
                    #call, kmm_status_name(got_), kmm_status_name(want), kmm_last_error());  \
            failures++;                                                                      \
        }                                                                                    \
    } while (0)

static void fill_pattern(uint8_t *p, size_t n, uint32_t seed) {
    uint32_t x = seed * 2654435761u + 1u;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        p[i] = (uint8_t)x;
    }
}

static void round_trip(KmmManager m, uint64_t n, uint32_t kind, uint32_t seed) {
    uint8_t *in = malloc(n ? n : 1), *out = malloc(n ? n : 1);
    KmmBuffer b = 0;
    fill_pattern(in, n, seed);
    EXPECT(kmm_buffer_alloc(m, n, kind, &b), KMM_OK);
    EXPECT(kmm_copy_to_device(m, b, 0, in, n), KMM_OK);
    memset(out, 0, n);
    EXPECT(kmm_copy_to_host(m, out, b, 0, n), KMM_OK);
    checks++;
    if (memcmp(in, out, n) != 0) {
        fprintf(stderr, "round trip of %llu bytes (kind %u) differs\n", (unsigned long long)n, kind);
        failures++;
    }
    /* Async the other way, with an event. */
    KmmEvent ev = 0;
    memset(out, 0, n);
    EXPECT(kmm_copy_to_host_async(m, out, b, 0, n, &ev), KMM_OK);
    EXPECT(kmm_event_wait(m, ev), KMM_OK);
    EXPECT(kmm_event_destroy(m, ev), KMM_OK);
    EXPECT(kmm_event_destroy(m, ev), KMM_ERROR_INVALID_HANDLE);
    checks++;
    if (memcmp(in, out, n) != 0) {
        fprintf(stderr, "async read of %llu bytes differs\n", (unsigned long long)n);
        failures++;
    }
    EXPECT(kmm_buffer_free(m, b, 0), KMM_OK);
    EXPECT(kmm_buffer_free(m, b, 0), KMM_ERROR_INVALID_HANDLE);
    free(in);
    free(out);
}

static void bad_inputs(KmmManager m, KmmManager other) {
    KmmBuffer b = 0, foreign = 0;
    uint8_t small[16] = {0};
    uint64_t ptr = 0;
    EXPECT(kmm_buffer_alloc(m, 100, KMM_MEMORY_DEVICE, NULL), KMM_ERROR_NULL_POINTER);
    EXPECT(kmm_buffer_alloc(m, 100, 7, &b), KMM_ERROR_INVALID_ARGUMENT);
    EXPECT(kmm_buffer_alloc(m, KMM_MAX_BUFFER_BYTES + 1, KMM_MEMORY_DEVICE, &b), KMM_ERROR_SIZE_OVERFLOW);
    EXPECT(kmm_buffer_alloc(m, UINT64_MAX, KMM_MEMORY_PINNED, &b), KMM_ERROR_SIZE_OVERFLOW);
    EXPECT(kmm_buffer_alloc(0, 100, KMM_MEMORY_DEVICE, &b), KMM_ERROR_INVALID_HANDLE);
    EXPECT(kmm_buffer_alloc(m, 100, KMM_MEMORY_DEVICE, &b), KMM_OK);
    EXPECT(kmm_buffer_alloc(other, 100, KMM_MEMORY_DEVICE, &foreign), KMM_OK);
    EXPECT(kmm_buffer_free(m, foreign, 0), KMM_ERROR_INVALID_HANDLE);
    EXPECT(kmm_buffer_free(m, b ^ (1ull << 30), 0), KMM_ERROR_INVALID_HANDLE);
    EXPECT(kmm_buffer_free(m, b, 99), KMM_ERROR_INVALID_ARGUMENT);
    EXPECT(kmm_copy_to_device(m, b, 90, small, 16), KMM_ERROR_OUT_OF_RANGE);
    EXPECT(kmm_copy_to_device(m, b, UINT64_MAX, small, 2), KMM_ERROR_OUT_OF_RANGE);
    EXPECT(kmm_copy_to_device(m, b, 0, NULL, 16), KMM_ERROR_NULL_POINTER);
    EXPECT(kmm_copy_to_host(m, small, b, 1, UINT64_MAX), KMM_ERROR_OUT_OF_RANGE);
    EXPECT(kmm_copy_to_host(m, NULL, b, 0, 16), KMM_ERROR_NULL_POINTER);
    EXPECT(kmm_copy_buffer(m, b, 0, m, b, 8, 16), KMM_ERROR_INVALID_ARGUMENT);
    EXPECT(kmm_copy_buffer(m, b, 0, other, foreign, 0, 100), KMM_OK);
    EXPECT(kmm_copy_buffer(m, b, 1, other, foreign, 0, 100), KMM_ERROR_OUT_OF_RANGE);
    EXPECT(kmm_fill(m, b, 0, 100, NULL, 1), KMM_ERROR_NULL_POINTER);
    EXPECT(kmm_fill(m, b, 0, 100, small, 0), KMM_ERROR_INVALID_ARGUMENT);
    EXPECT(kmm_fill(m, b, 0, 100, small, 3), KMM_ERROR_INVALID_ARGUMENT);
    EXPECT(kmm_fill(m, b, 1, 99, small, 3), KMM_OK);
    EXPECT(kmm_buffer_map(m, b, NULL), KMM_ERROR_NULL_POINTER);
    EXPECT(kmm_buffer_unmap(m, b), KMM_ERROR_INVALID_ARGUMENT);
    EXPECT(kmm_buffer_map(m, b, &ptr), KMM_OK);
    EXPECT(kmm_buffer_free(m, b, 0), KMM_ERROR_BUFFER_MAPPED);
    EXPECT(kmm_buffer_unmap(m, b), KMM_OK);
    EXPECT(kmm_manager_stats(m, 5, NULL), KMM_ERROR_NULL_POINTER);
    EXPECT(kmm_manager_summary(m, NULL, 10, NULL), KMM_ERROR_NULL_POINTER);
    EXPECT(kmm_event_wait(m, 0xE000000000000001ull), KMM_ERROR_INVALID_HANDLE);
    EXPECT(kmm_manager_wait_stream(m, 42), KMM_ERROR_INVALID_ARGUMENT);
    EXPECT(kmm_host_register(m, NULL, 10), KMM_ERROR_NULL_POINTER);
    EXPECT(kmm_host_unregister(m, small), KMM_ERROR_INVALID_ARGUMENT);
    EXPECT(kmm_buffer_wrap(m, NULL, 10, KMM_MEMORY_DEVICE, KMM_BORROW, &b), KMM_ERROR_NULL_POINTER);
    EXPECT(kmm_buffer_wrap(m, small, 10, KMM_MEMORY_DEVICE, 9, &b), KMM_ERROR_INVALID_ARGUMENT);
    EXPECT(kmm_buffer_free(other, foreign, 0), KMM_OK);
    /* b stays live: the manager's destroy frees it. */
}

int main(void) {
    KmmConfig cfg;
    KmmManager m = 0, other = 0, dead = 0;
    KmmBuffer b = 0;
    printf("libkmm %s, ABI %u\n", kmm_version(), kmm_abi_version());
    if (kmm_abi_version() != KMM_ABI_VERSION) {
        fprintf(stderr, "ABI mismatch\n");
        return 2;
    }
    EXPECT(kmm_config_default(&cfg), KMM_OK);
    cfg.backend = KMM_BACKEND_HOST;
    cfg.chunk_size = 1 << 20;
    cfg.staging_chunk_size = 64 << 10;
    EXPECT(kmm_manager_create(&cfg, NULL), KMM_ERROR_NULL_POINTER);
    cfg.alignment = 3;
    EXPECT(kmm_manager_create(&cfg, &m), KMM_ERROR_INVALID_ARGUMENT);
    cfg.alignment = 256;
    EXPECT(kmm_manager_create(&cfg, &m), KMM_OK);
    cfg.suballocator = KMM_SUBALLOC_HEAP;
    EXPECT(kmm_manager_create(&cfg, &other), KMM_OK);

    for (uint32_t kind = 0; kind < 2; kind++) {
        const uint64_t sizes[] = {0, 1, 255, 4097, 65536, 300000, 1u << 21};
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) round_trip(m, sizes[i], kind, (uint32_t)i);
    }
    bad_inputs(m, other);

    /* Adopted memory: Kmm frees it with free(). Borrowed memory: we free it after the buffer. */
    void *adopt = malloc(4096);
    void *borrow = malloc(4096);
    EXPECT(kmm_buffer_wrap(m, adopt, 4096, KMM_MEMORY_DEVICE, KMM_ADOPT, &b), KMM_OK);
    EXPECT(kmm_buffer_free(m, b, 0), KMM_OK);
    EXPECT(kmm_buffer_wrap(m, borrow, 4096, KMM_MEMORY_PINNED, KMM_BORROW, &b), KMM_OK);
    EXPECT(kmm_fill(m, b, 0, 4096, "ab", 2), KMM_OK);
    EXPECT(kmm_buffer_free(m, b, 0), KMM_OK);
    EXPECT(kmm_manager_synchronize(m), KMM_OK);
    free(borrow);

    /* Registered host memory goes direct. */
    uint8_t *reg = malloc(1 << 20);
    fill_pattern(reg, 1 << 20, 9);
    EXPECT(kmm_host_register(m, reg, 1 << 20), KMM_OK);
    EXPECT(kmm_buffer_alloc(m, 1 << 20, KMM_MEMORY_DEVICE, &b), KMM_OK);
    EXPECT(kmm_copy_to_device(m, b, 0, reg, 1 << 20), KMM_OK);
    EXPECT(kmm_host_unregister(m, reg), KMM_OK);
    free(reg);

    /* Summary and stats. */
    size_t needed = 0;
    EXPECT(kmm_manager_summary(m, NULL, 0, &needed), KMM_OK);
    char *text = malloc(needed);
    EXPECT(kmm_manager_summary(m, text, needed, NULL), KMM_OK);
    checks++;
    if (strlen(text) + 1 != needed) failures++;
    free(text);
    KmmMemoryStats s;
    EXPECT(kmm_manager_stats(m, KMM_MEMORY_DEVICE, &s), KMM_OK);
    EXPECT(kmm_manager_trim(m, 0), KMM_OK);

    /* Destroy with live and mapped buffers; then every handle is dead. */
    uint64_t ptr = 0;
    EXPECT(kmm_buffer_map(m, b, &ptr), KMM_OK);
    dead = m;
    EXPECT(kmm_manager_destroy(m, 0), KMM_OK);
    EXPECT(kmm_manager_destroy(dead, 0), KMM_ERROR_INVALID_HANDLE);
    EXPECT(kmm_buffer_free(dead, b, 0), KMM_ERROR_INVALID_HANDLE);
    EXPECT(kmm_manager_synchronize(dead), KMM_ERROR_INVALID_HANDLE);

    /* Deferred destroy of a manager with live buffers; the teardown thread is joined by waiting
       for the next create to reuse nothing of it (we just give it time to finish). */
    EXPECT(kmm_buffer_alloc(other, 5000, KMM_MEMORY_PINNED, &b), KMM_OK);
    EXPECT(kmm_manager_destroy(other, KMM_DESTROY_DEFERRED), KMM_OK);
    EXPECT(kmm_buffer_free(other, b, 0), KMM_ERROR_INVALID_HANDLE);

    printf("%lu checks, %d failures\n", checks, failures);
    return failures == 0 ? 0 : 1;
}
