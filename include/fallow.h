/* fallow.h: the C API of fallow, a page allocator that zeroes free pages while the machine is
 * idle and returns unused pages to the kernel.
 *
 * Link with -lfallow (target/release/libfallow.so or libfallow.a; pkg-config file fallow.pc in
 * target/release, or in PREFIX/lib/pkgconfig after `make install PREFIX=...`). Every function
 * is thread-safe. Functions that can fail return 0 on success or an errno value (ENOMEM, EINVAL,
 * ...), also stored in errno; fallow_last_error() then gives a message naming the cause (and the
 * address, for a bad pointer). No function here calls malloc on the allocation and free paths.
 */
#ifndef FALLOW_H
#define FALLOW_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Allocation flags (may be or-ed). */
#define FALLOW_ZERO     1u /* contents read zero (no memset for pages known zeroed or reported) */
#define FALLOW_POPULATE 2u /* every page resident on return */
#define FALLOW_LOCK     4u /* mlock the block (implies resident); fails with EPERM/ENOMEM by RLIMIT_MEMLOCK */

/* Backing of the arenas. */
#define FALLOW_BACKING_ANONYMOUS 0
#define FALLOW_BACKING_MEMFD     1

typedef struct fallow_allocator fallow_allocator;

typedef struct fallow_config {
    size_t arena_size;  /* bytes reserved per arena; 0: the machine's RAM */
    uint32_t max_order; /* largest block = 4 KiB << max_order, 0..30; default 18 (1 GiB) */
    int thp;            /* 1: transparent huge pages on the arenas (needs max_order >= 9); default 0 */
    int backing;        /* FALLOW_BACKING_* */
} fallow_config;

/* The per-thread page caches (apart from fallow_config, whose layout stays as it was). A thread
 * keeps free blocks of 4 KiB up to 4 KiB << max_order and serves them without a lock. */
typedef struct fallow_cache_config {
    int cache;            /* 1: per-thread caches (default), 0: none */
    uint32_t max_order;   /* largest cached order, 0..11 (4 KiB to 8 MiB); default 11 (8 MiB) */
    uint32_t batch_pages; /* pages moved per refill or drain, 1..high_pages; default 64 */
    uint32_t high_pages;  /* most pages one thread holds, 2..65536, plus one block of each
                           * cached order above half of it; default 1024 (4 MiB) */
} fallow_cache_config;

#define FALLOW_CLASSES 3 /* free-list classes: 0 dirty, 1 zeroed, 2 reported */
#define FALLOW_ORDERS 31

typedef struct fallow_stats {
    uint64_t bytes_in_use;          /* bytes in live blocks (page-rounded) */
    uint64_t live_blocks;
    uint64_t free_dirty_pages;      /* free pages by state */
    uint64_t free_zeroed_pages;
    uint64_t free_reported_pages;
    uint64_t free_lazy_pages;
    uint64_t isolated_pages;        /* free pages held by a background worker right now */
    uint64_t reserved_bytes;        /* address space reserved ... */
    uint64_t arenas;                /* ... in this many arenas */
    uint64_t alloc_calls;
    uint64_t free_calls;
    uint64_t zero_skipped_bytes;    /* FALLOW_ZERO bytes served without a memset */
    uint64_t zeroed_on_alloc_bytes; /* FALLOW_ZERO bytes memset on allocation */
    uint64_t reused_reported_bytes; /* reported bytes handed out again */
    uint64_t locked_bytes;          /* bytes mlocked now */
    uint64_t cached_pages; /* free pages held in per-thread caches (counted as free) */
    uint64_t cache_hits; /* allocations and frees served by a per-thread cache */
    uint64_t reported_bytes; /* bytes given back to the kernel by the reporting worker and by trims */
    uint64_t report_calls; /* reporting system calls */
    uint64_t report_batches;
    uint64_t report_ns; /* nanoseconds spent in reporting system calls */
    uint64_t reported_blocks_reused; /* blocks handed out that held reported pages */
    uint64_t zeroed_background_bytes; /* bytes zeroed by the background worker */
    uint64_t zeroing_wasted_bytes; /* background-zeroed bytes reported or handed out without being used as zero */
    uint64_t slack_bytes; /* unused bytes past the request in live blocks a per-thread cache served whole */
    uint64_t free_blocks[FALLOW_CLASSES][FALLOW_ORDERS]; /* free blocks by class and order */
    /* From here on: filled by fallow_stats_read_size only. */
    uint64_t memory_limit_bytes; /* the soft memory limit in force (a cgroup's less a margin), 0: none */
    uint64_t memory_limit_source; /* 0 none, 1 setting, 2 cgroup v2 memory.high, 3 cgroup v2 memory.max, 4 cgroup v1 */
    uint64_t memory_limit_usage_bytes; /* what the limit was last compared with */
    uint64_t memory_limit_hits; /* times the usage passed the limit */
    uint64_t limit_reported_bytes; /* bytes given back before their delay because of the limit */
    uint64_t pressure_signal; /* 0 off, 1 PSI cgroup, 2 PSI /proc/pressure/memory, 3 MemAvailable polling, 4 none */
    uint64_t pressure_events; /* times memory pressure was signalled */
    uint64_t pressure_reported_bytes; /* bytes given back before their delay because of pressure */
    /* From here on: small objects (an allocator made with FALLOW_CREATE_SMALL_OBJECTS; all 0
     * without), filled by fallow_stats_read_size given a struct this large. */
    uint64_t small_live_objects; /* small objects live (one another thread freed counts until its span's owner collects it) */
    uint64_t small_live_bytes; /* their bytes (class sizes) */
    uint64_t small_spans; /* spans: page blocks cut into small objects (live blocks, in bytes_in_use) */
    uint64_t small_span_bytes;
    uint64_t small_spare_spans; /* empty spans kept, one at most per class and thread */
    uint64_t small_free_bytes; /* span bytes in no live small object */
} fallow_stats;

/* The default configuration. */
void fallow_config_init(fallow_config *config);

/* Create an allocator (config NULL: the default). Every allocator is locked around fork (see
 * fork below). */
int fallow_create(const fallow_config *config, fallow_allocator **out);

/* fallow_create with the FALLOW_* environment variables of the LD_PRELOAD library applied over
 * config (NULL: the default): FALLOW_ARENA_SIZE, FALLOW_THP and FALLOW_CACHE,
 * FALLOW_CACHE_MAX_ORDER, FALLOW_CACHE_BATCH_PAGES, FALLOW_CACHE_HIGH_PAGES and FALLOW_SMALL (1: small
 * objects, as FALLOW_CREATE_SMALL_OBJECTS) set the configuration,
 * FALLOW_REPORT (dontneed, free, off), FALLOW_REPORT_DELAY_MS, FALLOW_ZEROING (idle, off),
 * FALLOW_MEMORY_LIMIT (auto, off, or a size such as 2GiB) and FALLOW_PRESSURE (auto, off) the
 * tunables; FALLOW_THRESHOLD and FALLOW_STATS, the preload's own, are only checked. A bad value
 * prints one warning on stderr naming the variable, the value given and the value used (the
 * config's, or the nearest value in range), and the allocator is created all the same. */
int fallow_create_from_env(const fallow_config *config, fallow_allocator **out);

/* The default cache settings. */
void fallow_cache_config_init(fallow_cache_config *cache);

/* fallow_create with the cache settings of cache (NULL: the default); with from_env != 0, the
 * FALLOW_* variables applied over both, as fallow_create_from_env does. EINVAL, with a message
 * naming the setting and its range, for a value out of range. */
int fallow_create_with_cache(const fallow_config *config, const fallow_cache_config *cache, int from_env,
                             fallow_allocator **out);

/* Options of fallow_create_with_options (may be or-ed). */
#define FALLOW_CREATE_FROM_ENV      1u /* the FALLOW_* variables over the settings, as from_env above */
#define FALLOW_CREATE_SMALL_OBJECTS 2u /* small objects: requests of up to FALLOW_SMALL_MAX are
                                        * objects of size classes in spans of pages (see fallow_alloc) */
/* The largest small object (64 KiB); larger requests are page blocks at their real size. */
#define FALLOW_SMALL_MAX 65536

/* fallow_create_with_cache with options instead of from_env (unknown bits: EINVAL). With
 * FALLOW_CREATE_FROM_ENV, FALLOW_SMALL (0 or 1), when set, decides over FALLOW_CREATE_SMALL_OBJECTS. */
int fallow_create_with_options(const fallow_config *config, const fallow_cache_config *cache, unsigned options,
                               fallow_allocator **out);

/* The cache settings an allocator was created with. */
int fallow_cache_config_read(fallow_allocator *a, fallow_cache_config *out);

/* Destroy an allocator and unmap all its memory, live blocks included. NULL is ignored. Its
 * background workers are stopped first, then it leaves the fork handlers' registry (see fork
 * below), then its memory goes. */
void fallow_destroy(fallow_allocator *a);

/* fork. Every allocator made by fallow_create, fallow_create_from_env, fallow_create_with_cache
 * or fallow_create_with_options is locked around every fork() of the process by pthread_atfork
 * handlers that the library registers when it is loaded: the program calls nothing for it.
 * - A threaded program may fork while other threads are inside its allocators. The child may
 *   use every allocator that existed at the fork (allocate, free blocks and small objects any
 *   parent thread had, read the statistics, set tunables, destroy it) and create new ones. The
 *   parent's background workers do not exist in the child: it starts its own when a free gives
 *   them work (or at its next fallow_set_tunable that succeeds).
 * - An allocator is registered before fallow_create* returns it, and fallow_destroy takes it out
 *   once its workers are stopped and before its memory goes. A fork in another thread waits for
 *   a registration or a removal under way (and they for it): in the child, each allocator is
 *   either locked and reset, or one that no thread had yet or any more.
 * - No limit on the number of allocators: the registry takes a page for each 255 allocators
 *   alive at once, mapped by fallow_create* (never by the fork handlers) and kept for the life of
 *   the process, and a destroyed allocator's place is reused. fallow_create* fails with ENOMEM,
 *   creating nothing, when the kernel refuses that page.
 * - Not covered: a child made without the fork handlers (the clone or vfork system calls) must
 *   only exec or _exit, as POSIX asks; a fork from a signal handler that interrupted one of this
 *   library's calls waits forever (the handlers wait for the lock that call holds); with small
 *   objects, a parent thread caught by the fork inside a lock-free small-object call (a thread's
 *   own objects, no lock) may leave that thread's lists or counts half-changed in the child. */

/* Allocate size bytes aligned to align (a power of two, at most the largest block; 0 means 4096)
 * with FALLOW_* flags; *out receives the block. With small objects on (FALLOW_CREATE_SMALL_OBJECTS,
 * or FALLOW_SMALL=1 from the environment), a request of up to FALLOW_SMALL_MAX is a small object
 * of the size class that fits it (16-byte steps to 128 bytes, then four classes per doubling to
 * 16 KiB and eight to 64 KiB), aligned to 16 bytes (align 0), or to align and its size (a
 * power-of-two class, up to 16 KiB), and FALLOW_ZERO zeroes it as calloc does; FALLOW_POPULATE
 * and FALLOW_LOCK, or an alignment above 16 bytes whose power-of-two class would pass 16 KiB,
 * make it a page block. Larger requests are page blocks, page-aligned whatever align asks. */
int fallow_alloc(fallow_allocator *a, size_t size, size_t align, unsigned flags, void **out);

/* Free a block or small object (EINVAL for an address that is not a live block, one inside a
 * small object or never handed out, or a double free: for small objects, the immediate one). */
int fallow_free(fallow_allocator *a, void *p);

/* Free a block, checking its size (EINVAL when it does not match the block's pages; for a small
 * object, when it is 0 or above its class size). */
int fallow_free_sized(fallow_allocator *a, void *p, size_t size);

/* Resize in place: *resized is 1 when done (shrinking always succeeds; growing needs the pages
 * after the block to be free), 0 when the caller must move the block. A small object is
 * resized when new_size fits its class size (it stays where it is, nothing is given back). */
int fallow_resize_in_place(fallow_allocator *a, void *p, size_t new_size, int *resized);

/* Usable bytes of the live block at p (page-rounded), or of the small object (its class size), 0
 * if p is neither. */
size_t fallow_usable_size(fallow_allocator *a, const void *p);

/* 1 if p lies in a's reservation (a lock-free range check), else 0. */
int fallow_owns(const fallow_allocator *a, const void *p);

/* A snapshot of the statistics. fallow_stats_read fills the fields up to free_blocks (the struct
 * of the first version, so programs built against it keep working); fallow_stats_read_size fills
 * min(size, sizeof(fallow_stats)) bytes: pass sizeof(fallow_stats) (a program built against an
 * earlier header passes the size its struct had, up to pressure_reported_bytes or free_blocks,
 * and gets that much). */
int fallow_stats_read(fallow_allocator *a, fallow_stats *out);
int fallow_stats_read_size(fallow_allocator *a, fallow_stats *out, size_t size);

/* Give free memory back to the kernel now, but at least keep bytes of it (glibc's malloc_trim,
 * whose pad it is; a free block that would take it below keep stays): the calling thread's cached blocks and empty spans of small objects, the cached blocks
 * of idle threads, then every free block with resident pages, whatever its age (dirty ones before
 * zeroed ones), in batches without holding the lock across a system call; with the background
 * workers off too. The bytes given back that were resident go to *given if given is not null.
 * 0, or EINVAL for a null a. */
int fallow_trim(fallow_allocator *a, size_t keep, uint64_t *given);

/* Tunables of the background workers, by name: "report", "report_order", "report_delay_ms",
 * "report_batch", "resident_free_min", "report_mode" (0 auto, 1 dontneed, 2 free, 3 punch),
 * "zeroing", "zero_order", "zero_chunk", "zero_delay_ms", "zeroed_reserve", "populated_reserve",
 * "memory_limit" (the soft memory limit: FALLOW_MEMORY_LIMIT_OFF, FALLOW_MEMORY_LIMIT_AUTO for the
 * cgroup's limit less a margin, or bytes, at least 4096; it never fails an allocation, it makes
 * free memory go back to the kernel at once once passed), "pressure" (1: watch memory pressure,
 * PSI memory stall or MemAvailable, and give idle free memory back while there is some).
 * Booleans are 0 or 1, sizes in bytes, orders as powers of two of 4 KiB. EINVAL, with a message
 * naming the setting and its accepted range, for an unknown name or a value out of range. */
#define FALLOW_MEMORY_LIMIT_OFF  0u
#define FALLOW_MEMORY_LIMIT_AUTO UINT64_MAX
int fallow_set_tunable(fallow_allocator *a, const char *name, uint64_t value);
int fallow_get_tunable(fallow_allocator *a, const char *name, uint64_t *value);

/* The message of the last failed call on this thread ("" if none): a thread-local buffer, valid
 * until the next failing call on this thread. */
const char *fallow_last_error(void);

/* The library version, "MAJOR.MINOR.PATCH". */
const char *fallow_version(void);

#ifdef __cplusplus
}
#endif
#endif /* FALLOW_H */
