/* SPDX-License-Identifier: MIT */
/*
 * codegen.h -- the internal header of codegen/: it turns the fused kernel
 * groups of fusion/ into source text, one dialect per backend (C + OpenMP
 * for the CPU, CUDA C through NVRTC, HIP, OpenCL C), compiles that source
 * and caches the binaries on disk so that a second process compiles
 * nothing.
 *
 * The disk cache (cache.c) works like Triton's: one directory per key under
 * the cache root, where the key is a SHA-256 over everything that decides
 * the binary (generator version, dialect, compiler and its version, target
 * CPU, flags, source). A build writes into a fresh temporary directory and
 * renames it into place, so readers never see half an entry and two
 * processes racing on one key end with one valid entry. Environment
 * variables, read at every build:
 *   SG_CACHE_DIR      the cache root (else $XDG_CACHE_HOME/stepgraph, else
 *                     $HOME/.cache/stepgraph, else /tmp/stepgraph-<uid>)
 *   SG_DUMP_DIR       every compiled source is also written there as <name>.c
 *   SG_OVERRIDE_DIR   if <dir>/<name>.c exists it is compiled instead of the
 *                     generated source (for hand-editing a kernel)
 *   SG_ALWAYS_COMPILE =1: skip the lookup, compile, and publish the entry
 *   SG_CC             the C compiler, one program looked up in PATH (no
 *                     shell, no arguments); default "cc"
 *   SG_CFLAGS         extra flags, split on spaces, after the default ones
 *   SG_COMPILE_TIMEOUT seconds the compiler may run (default 120; 0: none)
 *   SG_CACHE_MAX_MB   the size limit of the root (default 1024; 0: none)
 * The root and SG_OVERRIDE_DIR must be the user's and writable by no one
 * else; see "cache files" below for the rules every file access follows.
 *
 * Generated C is compiled with -O3 -march=native -fPIC -shared -std=c11,
 * plus -fopenmp when the library itself was built with OpenMP, and
 * -fsanitize=address,undefined when it was built with STEPGRAPH_SANITIZE. Emitters
 * should guard OpenMP pragmas with #ifdef _OPENMP, so that code stays
 * warning-free (the tests build with SG_CFLAGS="-Wall -Werror").
 */
#ifndef SG_CODEGEN_H
#define SG_CODEGEN_H

#include "../fusion/fusion.h"

#include <stddef.h>
#include <stdint.h>

/* ------------------------------------------------------------ disk cache and compiler driver */

/* Bump when generated code or the compile recipe changes meaning: old
 * entries then stop matching and are simply left unused. */
#define SG__CODEGEN_VERSION "2"

typedef struct sg__module sg__module; /* a loaded shared object */

typedef struct sg__cache_stats {
    uint64_t compiles;        /* compiler runs that produced a binary */
    uint64_t hits;            /* builds served from the disk cache */
    uint64_t rebuilt_corrupt; /* entries found damaged, removed and rebuilt */
} sg__cache_stats;

/*
 * Compile C source (dialect "c") into a shared object, through the disk
 * cache, and load it. name is the module's readable name: a file name made
 * of [A-Za-z0-9_.-] (it names <name>.c in SG_DUMP_DIR and SG_OVERRIDE_DIR).
 * On success *out is the module (free it with sg__module_free). On failure:
 * SG_ERR_COMPILE (compiler missing, compile errors -- the message holds the
 * first lines of the compiler's log and the path of the full log -- or the
 * cache directory unusable), SG_ERR_OOM, or SG_ERR_INVALID_ARG for a bad
 * name; nothing is leaked.
 */
SG__HIDDEN sg_status sg__cache_build_c(sg_ctx *ctx, const char *name, const char *source,
                                       sg__module **out);
/* The address of a symbol in the module; NULL if absent. */
SG__HIDDEN void *sg__module_sym(const sg__module *m, const char *symbol);
/* The cache entry the module was loaded from (for logs and explain). */
SG__HIDDEN const char *sg__module_path(const sg__module *m);
/* dlclose and free; NULL does nothing. */
SG__HIDDEN void sg__module_free(sg_ctx *ctx, sg__module *m);
/* The cache root (SG_CACHE_DIR and its defaults), created 0700 if missing,
 * into root; name is the kernel the caller builds, for messages. Other
 * dialects (nvrtc.c) keep their entries there. SG_ERR_COMPILE when the root
 * cannot be used, or cannot be trusted (not the user's, or writable by
 * group or others: the message names the directory and the fix). */
SG__HIDDEN sg_status sg__cache_root(sg_ctx *ctx, const char *name, char *root, size_t size);
/* The same, except that a root that merely cannot be used (not creatable,
 * not writable, not a directory) gives SG_OK and root "" (build without
 * the cache: said once per process under "fallbacks"). An untrusted root
 * is still SG_ERR_COMPILE. */
SG__HIDDEN sg_status sg__cache_root_or_none(sg_ctx *ctx, const char *name, char *root,
                                            size_t size);
/* SG_ALWAYS_COMPILE is set (and not 0): every compile skips the caches,
 * and the CUDA kernel families the build compiled. */
SG__HIDDEN bool sg__always_compile(void);

/* ------------------------------------------------------------ cache files (cache_dir.c) */

/*
 * The trust rules: a directory code is loaded from belongs to the user
 * (owner == geteuid()) and is writable by no one else; a file is opened
 * with O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, fstat'ed, and must be a regular
 * file (owned by the user when `own`), so that a link, a FIFO or a device
 * is refused instead of followed or waited on.
 */
/* 0, or ENOENT / ENOTDIR / another stat errno, or EPERM (not the user's, or
 * writable by group or others). follow: stat (the root the user named)
 * rather than lstat (entries, which must not be links). */
SG__HIDDEN int sg__dir_trusted(const char *path, bool follow);
/* 0, or EPERM with the first unsafe directory above path (as named, then as
 * it resolves) in bad, or a stat errno. Safe: owned by root or the user,
 * and not writable by group or others unless sticky. sg__parent_why
 * writes what is wrong with bad and the fix into buf, for messages. */
SG__HIDDEN int sg__dir_parents_trusted(const char *path, char *bad, size_t size);
SG__HIDDEN const char *sg__parent_why(const char *bad, char *buf, size_t size);
/* An fd (blocking again after the checks), or -errno: -EINVAL for a file
 * that is not regular, -EPERM for one owned by someone else, -ELOOP for a
 * link. flags: O_RDONLY, or O_WRONLY | O_CREAT | O_TRUNC (mode 0644). */
SG__HIDDEN int sg__open_file(const char *path, int flags, bool own);
/* The reason for an errno of the helpers here, in words. */
SG__HIDDEN const char *sg__file_why(int err);
/* mkdir -p (mode for the levels it creates), a whole file written through
 * sg__open_file, and a whole file read (at most max bytes; *data is
 * sg__alloc'd, *size + 1 bytes, NUL-terminated). Each returns 0 or an
 * errno (EFBIG: over max). */
SG__HIDDEN int sg__make_dirs(const char *path, unsigned mode);
SG__HIDDEN int sg__write_file(const char *path, const void *data, size_t n);
SG__HIDDEN int sg__read_file(sg_ctx *ctx, const char *path, size_t max, char **data,
                             size_t *size);
/* Remove a directory of plain files without following links (a file or a
 * link at dir is removed itself); errors are ignored. */
SG__HIDDEN void sg__remove_dir(const char *dir);
/* Run argv[0] (from PATH, no shell) with stdout and stderr into out_fd, at
 * most timeout_s seconds (0: no limit; then its process group is killed).
 * Returns 0 (*status: the wait status), ETIMEDOUT, or the spawn's errno
 * (ENOENT: no such program). */
SG__HIDDEN int sg__run_program(char *const argv[], int out_fd, int *status, double timeout_s);
/* Take an entry (directory or file) out of the cache atomically: renamed
 * into a fresh <root>/trash-XXXXXX, then deleted. */
SG__HIDDEN void sg__cache_discard(const char *root, const char *dir);
/* Mark an entry used now (its mtime orders eviction). */
SG__HIDDEN void sg__cache_touch(const char *path);
/* SG_CACHE_MAX_MB (default 1024; 0: no limit). */
SG__HIDDEN double sg__cache_limit_mb(void);
/* After a publish: remove tmp-* and trash-* older than an hour, then the
 * least recently used entries until the root is within SG_CACHE_MAX_MB;
 * never `keep` (the name, in root, of the entry just written). */
SG__HIDDEN void sg__cache_evict(sg_ctx *ctx, const char *root, const char *keep);
/* SG_OVERRIDE_DIR/<name><ext>: *text (sg__alloc'd, *n + 1 bytes) or NULL
 * when there is none; SG_ERR_COMPILE when the directory is not trusted or
 * the file is not a regular file of the user's. */
SG__HIDDEN sg_status sg__read_override(sg_ctx *ctx, const char *name, const char *ext,
                                       char **text, size_t *n);
/* SG_DUMP_DIR/<name><ext> gets src (never written through a link). */
SG__HIDDEN sg_status sg__dump_source(sg_ctx *ctx, const char *name, const char *ext,
                                     const char *src, size_t n);
/* Small text kept beside an entry (max-autotune's picks), with its own
 * checksum line: read gives false for a missing, damaged or foreign note
 * (the caller then recomputes and writes it again); write replaces the
 * note atomically and gives whether it did. body: at most 4 KiB. */
SG__HIDDEN bool sg__note_read(const char *path, char *body, size_t size);
SG__HIDDEN bool sg__note_write(const char *path, const char *body);
/* Process-wide counters since the process started. */
SG__HIDDEN void sg__cache_get_stats(sg__cache_stats *out);
/*
 * Fault injection, for tests: after sg__file_fault_set(n) (n > 0), the n-th
 * cache file operation from then on -- an open through sg__open_file, a
 * write of sg__write_file or of a note, the rename that publishes an entry
 * or a note -- fails with EIO; n = 0 turns it off. sg__file_fault_count
 * gives the operations counted since the set (set a large n to count a
 * clean run). Process-wide; each such operation first asks sg__file_fault.
 */
SG__HIDDEN void sg__file_fault_set(long n);
SG__HIDDEN long sg__file_fault_count(void);
SG__HIDDEN bool sg__file_fault(void);

/* SHA-256 (sha256.c): one shot, and incremental for keys built of parts. */
typedef struct sg__sha256_ctx {
    uint32_t h[8];
    uint64_t nbytes;
    uint8_t buf[64];
    size_t nbuf;
} sg__sha256_ctx;
SG__HIDDEN void sg__sha256(const void *data, size_t n, uint8_t out[32]);
SG__HIDDEN void sg__sha256_init(sg__sha256_ctx *s);
SG__HIDDEN void sg__sha256_update(sg__sha256_ctx *s, const void *data, size_t n);
SG__HIDDEN void sg__sha256_final(sg__sha256_ctx *s, uint8_t out[32]);
/* 64 lowercase hex digits and a NUL into hex. */
SG__HIDDEN void sg__sha256_hex(const uint8_t digest[32], char hex[65]);

/* Cache entries of one file holding a compiled image (blob.c): the key of
 * a list of strings (64 hex digits), a lookup (*img sg__alloc'd, NULL on a
 * miss; a damaged file is removed; SG_ERR_OOM, said, when host memory for
 * reading the entry runs out: not a miss, which would compile again without
 * a word) and a publish (temporary file, rename, then eviction; failure
 * only costs a later compile, so it is silent). */
SG__HIDDEN void sg__blob_key(const char *const *fields, int n, char key[65]);
SG__HIDDEN sg_status sg__blob_lookup(sg_ctx *ctx, const char *path, const char magic[8], void **img,
                                     size_t *size);
SG__HIDDEN void sg__blob_publish(sg_ctx *ctx, const char *root, const char *path,
                                 const char magic[8], const void *img, size_t size);

/* ------------------------------------------------------------ the emitter (emit.c) */

typedef struct sg__emit {
    sg_ctx *ctx;
    char *buf;
    size_t len, cap;
    int depth;
    bool oom;
} sg__emit;

SG__HIDDEN void sg__emit_raw(sg__emit *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* One line at the current depth. */
SG__HIDDEN void sg__emit_line(sg__emit *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* "<line> {" and one level deeper; sg__emit_close ends it. */
SG__HIDDEN void sg__emit_open(sg__emit *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
SG__HIDDEN void sg__emit_close(sg__emit *e);
SG__HIDDEN void sg__emit_free(sg__emit *e);

/* ------------------------------------------------------------ op lowering and dialects (lower.c)
 */

/*
 * The op semantics of generated code, written once: every generator calls
 * these for its expressions, and a dialect differs only by its entry in
 * the table of spellings (sg__spell). Values are computed in float for
 * f32/f16/bf16 (rounded to the dtype after every op, as the eager path
 * does) and in 64-bit integers for i32/i64/bool.
 */
typedef enum sg__dialect {
    SG__DIALECT_C,     /* C11 + OpenMP, for the CPU (cgen_c.c) */
    SG__DIALECT_CUDA,  /* CUDA C for NVRTC (cgen_cuda.c) */
    SG__DIALECT_HIP,   /* the CUDA text, for hiprtc (which adds the HIP prelude) */
    SG__DIALECT_OPENCL /* OpenCL C 1.2 and later (no generic address space needed) */
} sg__dialect;

typedef struct sg__spell {
    const char *name;                       /* in words, for messages and unit titles */
    const char *u8, *u16, *i32, *i64, *u64; /* storage and value types */
    const char *i64_min;                    /* the least 64-bit integer as a constant */
    const char *ll;                         /* the suffix of a 64-bit integer literal */
    const char *fn;                         /* the qualifier of the preamble's helpers */
    const char *mf;                         /* the suffix of float math functions ("f": expf) */
    const char *gp;                         /* the address space of tensor pointers ("__global ") */
    const char *fbits;                      /* a float from its bits (printf: %08x bits, %g value);
                                               NULL: a hex literal of the double */
    const char *h_rt, *bf_rt;               /* a float rounded to f16/bf16 and back (printf: %s) */
    const char *head, *tail;                /* the preamble before and after the shared helpers */
    /* GPU dialects: the kernel's qualifier, thread and block indices and
     * counts along x, the block barrier, and whether kernels declare
     * __launch_bounds__ and have warp shuffles (row and GEMV kernels). */
    const char *kernel, *tid, *bid, *bdim, *gdim, *sync;
    bool launch_bounds, shuffles;
    /* GPU dialects: the function giving a float from its bits
     * ("__uint_as_float"), the qualifier of an array the block shares and
     * the address space of a pointer into one, and whether such arrays are
     * declared at the kernel's outermost scope (OpenCL C), not where used.
     * Without shuffles a team combines its lanes through such an array, in
     * the order the shuffles would (sg__cuda_tree). */
    const char *u2f, *shared, *lp;
    bool shared_top;
    /* GPU dialects: the qualifier of a constant table of integers declared
     * in a kernel (sg__cuda_table); NULL where the dialect keeps none (each
     * member of a MULTI then runs its own code). */
    const char *table;
    /* The same in the constant bank, where the dialect has one (NULL: none):
     * a table every thread of a block reads at one index (a member's row)
     * is then served by the constant cache, which the streams of data a
     * MULTI kernel reads do not evict. A unit holds at most
     * SG__CONST_TABLES bytes of them; longer tables stay in `table`'s. */
    const char *ctable;
} sg__spell;
#define SG__CONST_TABLES (32 << 10)

/* The dialect's spellings (an unknown dialect gets C's). */
SG__HIDDEN const sg__spell *sg__spell_of(sg__dialect d);
/* The unit's preamble: the dialect's head, the helpers every unit has
 * (sg_h2f, sg_f2h, sg_bf2f, sg_f2bf, sg_f2i32, sg_f2i64, sg_gelu,
 * sg_gelu_tanh, sg_i2f_odd, SG_WRAP: one text, the dialect's qualifier),
 * then its tail. */
SG__HIDDEN void sg__lower_preamble(sg__dialect d, sg__emit *e);
/* Text written with CUDA's 64-bit literal suffixes (LL, ull) in dialect d,
 * whose suffix differs (OpenCL C: L, its long long being 128 bits): each
 * number's suffix rewritten in place. Returns the new length. */
SG__HIDDEN size_t sg__lower_literals(sg__dialect d, char *text, size_t len);
/* Is dt computed in float (f32, f16, bf16)? */
SG__HIDDEN bool sg__lower_fdom(sg_dtype dt);
/* The element type in memory, and the type of a value in registers. */
SG__HIDDEN const char *sg__lower_ctype(sg__dialect d, sg_dtype dt);
SG__HIDDEN const char *sg__lower_vtype(sg__dialect d, bool fl);
/* The value of element lvalue lv of dtype dt, widened to its domain. */
SG__HIDDEN void sg__lower_widen(sg__dialect d, sg_dtype dt, const char *lv, char *buf, size_t size);
/* `lv = v` narrowed to dt, as a statement. */
SG__HIDDEN void sg__lower_narrow_store(sg__dialect d, sg_dtype dt, const char *lv, const char *v,
                                       char *buf, size_t size);
/* Value e (float when src_float, else a 64-bit integer) narrowed to dt and
 * widened back, as a store and a load would. */
SG__HIDDEN void sg__lower_round_trip(sg__dialect d, const char *e, bool src_float, sg_dtype dt,
                                     char *buf, size_t size);
/* Scalar v in the domain of fl, following dt's rules (a half's is rounded once). */
SG__HIDDEN void sg__lower_scalar(sg__dialect d, double v, bool fl, sg_dtype dt, char *buf,
                                 size_t size);
/* Node n's op applied to argument texts a, b, c in the domain of fl; dt is
 * the dtype whose rules its scalars follow. False: not a pointwise op. */
SG__HIDDEN bool sg__lower_op(sg__dialect d, const sg__irnode *n, bool fl, sg_dtype dt,
                             const char *a, const char *b, const char *c, char *buf, size_t size);
/* Node n as a member of a loop: its op on args (texts of its inputs'
 * values), in the domain its inputs decide, rounded to its output's dtype. */
SG__HIDDEN bool sg__lower_member(sg__dialect d, const sg__ir *ir, const sg__fused *f,
                                 const sg__irnode *n, const char *const args[3], char *buf,
                                 size_t size);
/* IR ref r after cse's alias; node n's argument j (NULL when absent). */
SG__HIDDEN const sg__ref *sg__lower_ref(const sg__ir *ir, const sg__fused *f, int r);
SG__HIDDEN const sg__ref *sg__lower_arg(const sg__ir *ir, const sg__fused *f, const sg__irnode *n,
                                        int j);
/* Is r one element broadcast everywhere? Can a loop over (nd, shape)
 * address it as element i of a flat row-major walk? */
SG__HIDDEN bool sg__lower_is_scalar(const sg__ref *r);
SG__HIDDEN bool sg__lower_flat_ok(const sg__ref *r, int nd, const int64_t *shape);
/* The member of grp whose register holds member k's argument j, or -1 when
 * it is loaded (the anchor's value is a register only when anchor_reg). */
SG__HIDDEN int sg__lower_reg_src(const sg__group *grp, int k, int j, bool anchor_reg);
/* Is every ref members [from, to) of grp load or store flat-addressable? */
SG__HIDDEN bool sg__lower_group_flat(const sg__ir *ir, const sg__fused *f, const sg__group *grp,
                                     int from, int to, int nd, const int64_t *shape,
                                     bool anchor_reg);
/* The element offset of r at the loop indices (i when flat, else
 * i0..i<nd-1> of (nd, shape), broadcast dims left out), as text. */
SG__HIDDEN void sg__lower_offset(const sg__ref *r, int nd, const int64_t *shape, bool flat,
                                 char *buf, size_t size);

/* ------------------------------------------------------------ the C dialect (cgen_c.c) */

/*
 * The ABI between generated C and the library. Generated code sees each
 * IR slot as a base address (slot[s]: an input's element 0, a pool
 * address, a parameter's storage); every shape, stride and offset is a
 * constant in the source. Kernels it cannot express are run back in the
 * library through rt->run_node (the eager kernel of that IR node).
 *
 *   int sg_step(char *const *slot, const sg_rt *rt);          whole step
 *   int sg_kernel(int k, char *const *slot, const sg_rt *rt); kernel k alone
 *
 * Both return 0, or the status of a failed run_node.
 */
typedef struct sg__rt {
    void *ctx;
    int (*run_node)(void *ctx, int node);
} sg__rt;

typedef int (*sg__step_entry)(char *const *slot, const sg__rt *rt);
typedef int (*sg__kernel_entry)(int k, char *const *slot, const sg__rt *rt);

/* The translation unit of one fused capture, into e. `title` names it in
 * the header comment. */
SG__HIDDEN sg_status sg__cgen_c(sg_ctx *ctx, const sg__ir *ir, const sg__fused *f,
                                const char *title, sg__emit *e);

/* ------------------------------------------------------------ the CUDA dialect (cgen_cuda.c) */

/*
 * One CUDA C unit per fused capture, for NVRTC: self-contained (no
 * #include), every shape, stride and offset a constant, each kernel
 *     extern "C" __global__ void <name>(char *const *slot)
 * reading its tensors' base addresses from slot[], a table in device memory.
 * Slots are numbered per kernel: local entry 0 is the first IR slot the
 * kernel uses, 1 the next, and so on (kinfo.local), so that kernels doing
 * the same thing on different tensors (the layers of a model) have one text;
 * each distinct text is emitted once, named <ops>_<dtype>_<shape>_<hash of
 * the text>, and every group running it names it. A kernel using more than
 * SG__CUDA_MAX_LOCAL slots reads the capture-wide table (slot[s] is IR slot
 * s) instead: kinfo.nlocal is -1.
 * POINTWISE and MULTI groups, and the epilogue of a REDUCE, ROW or MATMUL
 * group whose anchor the library runs, become one kernel each; a MATMUL
 * group with at most 8 rows and a weight contiguous along K or along N
 * becomes one GEMV kernel that also computes the anchor (and its bias and
 * epilogue), so the library call is skipped; so does a rows_inline ROW or
 * REDUCE group (cgen_cuda_row.c). A MATMUL group with norm_rows (the
 * layer_norm/rms_norm before it merged in by fusion) is one such GEMV whose
 * blocks first compute the norm's rows into shared memory. One with
 * ncopies (the index_copy_ of views of its result that fusion merged: a
 * decode step's K/V cache writes) also writes each element of the result
 * that a copy's src covers into that copy's dst, from the thread that
 * holds it. Before its wait, a GEMV loads its weights (up to
 * GEMV_PREFETCH 16-byte vectors a lane) and its bias into registers and
 * sends the other parameters it reads (the norm's scale and shift) to L2.
 * Along K, a warp takes 1, 2 or 4 adjacent output columns (more when K
 * gives a lane few 16-byte loads and N still fills the SMs;
 * SG_GEMV_COLS=1|2|4 forces a count, for measuring). OPAQUE groups get
 * nothing.
 */
#define SG__CUDA_NTUNE 3 /* block sizes max-autotune tries: 128, 256, 512 */
#define SG__CUDA_MAX_LOCAL 64 /* entries of a kernel's own address table */
typedef struct sg__cuda_kinfo {
    char name[128];       /* the group's kernel, "" when it has none */
    unsigned grid, block; /* its launch: grid x 1 x 1 blocks of block threads */
    unsigned tune_grid[SG__CUDA_NTUNE]; /* the grid for blocks of 128 << i threads,
                                           all 0 when the block size is fixed */
    int64_t iters;        /* elements (GEMV: output columns) it covers */
    bool replaces_call;   /* the kernel computes the anchor: no library call */
    bool emitted;         /* its text is in the unit here; false: an earlier
                             group's kernel of the same name runs it */
    int nlocal;           /* entries of its address table, -1: the capture-wide one */
    bool unsupported;     /* the dialect has no kernel for the group (sg__cgen_gpu) */
    size_t text_at, text_len;      /* where its text lies in the unit, when emitted: a kernel
                                      needs only that and the unit's text before the first
                                      emitted kernel's (so a unit may be compiled in parts) */
    int local[SG__CUDA_MAX_LOCAL]; /* per entry, the IR slot whose base it holds */
} sg__cuda_kinfo;

/* The fusion options the CUDA dialect expects (no prologues before library
 * anchors: those read their input from memory; row-like anchors inline). */
SG__HIDDEN void sg__cgen_cuda_fuse_opts(sg__fuse_opts *o, bool disable);
/* SG_CUDA_STAMPS's replay count (0: off): generated CUDA kernels then stamp
 * their blocks' begin, wait and end times into sg_stamp_buf, SG__STAMP_N
 * entries of 8 u64 keyed by ((slot table address >> 3) & (SG__STAMP_N - 1)):
 * max of ~begin, max begin, max of ~wait, max wait, max end, blocks, and a
 * GEMV's two marks (its norm's rows ready, its sums ready), max of each. */
#define SG__STAMP_N 4096
#define SG__STAMP_N_TEXT "4096"
SG__HIDDEN int sg__cuda_stamps(void);

/* The unit into e; kinfo (f->ngroups entries) gets each group's kernel and
 * launch, *nkernels the count of groups that launch a generated kernel (the
 * distinct kernels are those with kinfo.emitted). */
SG__HIDDEN sg_status sg__cgen_cuda(sg_ctx *ctx, const sg__ir *ir, const sg__fused *f,
                                   const char *title, sg__emit *e, sg__cuda_kinfo *kinfo,
                                   int *nkernels);
/*
 * The same generator in GPU dialect d (sg__cgen_cuda is its CUDA call):
 *   SG__DIALECT_HIP     the CUDA text (sg__rtc_build puts sg__hip_prelude before it);
 *   SG__DIALECT_OPENCL  OpenCL C (1.2, or 3.0 without the generic address
 *       space: every pointer says __global), with CUDA's ABI and kinfo:
 *           __kernel void <name>(__global char *__global const *slot)
 *       slot[] a table of device addresses in device memory (SVM or USM),
 *       grid = work-groups, block = work-group size. Every kernel the
 *       CUDA dialect has (pointwise, MULTI, chain, data, epilogue, row and
 *       GEMV kernels, and MATMUL groups that no GEMV kernel takes as the
 *       generated GEMM: sg__cgen_gemm, in the dialects of
 *       sg__cgen_gemm_wanted), with the CUDA dialect's order of every sum,
 *       and the anchors CUDA's library runs (sg__cgen_serial). Where
 *       CUDA shuffles, a team combines its lanes through local memory and
 *       barriers (sg__cuda_tree), so a row kernel's work-group is its team
 *       (32 work-items for a row of at most 256, else 256), and the GEMV's
 *       warps all stay to the end; a long row or column range that CUDA
 *       cuts over blocks finished by the last one (kernel-owned device
 *       arrays, which PoCL lacks) is folded chunk by chunk by one
 *       work-group, to the same bits. A group the dialect cannot write
 *       (none today) has kinfo.unsupported and no kernel, and the call
 *       ends with SG_ERR_UNSUPPORTED naming its op, the unit in e holding
 *       every other group's kernel.
 * SG__DIALECT_C is no GPU dialect: SG_ERR_INVALID_ARG.
 */
SG__HIDDEN sg_status sg__cgen_gpu(sg_ctx *ctx, const sg__ir *ir, const sg__fused *f,
                                  const char *title, sg__dialect d, sg__emit *e,
                                  sg__cuda_kinfo *kinfo, int *nkernels);

/*
 * Row kernels (cgen_cuda_row.c): a ROW or REDUCE group that fusion marks
 * rows_inline becomes one kernel that computes its prologue, its anchor
 * (softmax, log_softmax, layer_norm, rms_norm, a sum/mean/var/argmax over
 * the innermost dims, or a sum/mean over leading dims keeping inner
 * columns) and its epilogues: a team of threads per row, a block per
 * column tile, or a few long rows cut over many blocks. It uses
 * cgen_cuda.c's emission state (sg__cuda_gen) and expression helpers
 * through the functions below, so that both write loads, stores and ops
 * one way.
 */
typedef struct sg__cuda_gen sg__cuda_gen;

/* The body of group grp's row kernel into sg__cuda_out(g) (the caller writes
 * the kernel's signature and slot bases); sets ki's launch, iters and
 * replaces_call. Returns the kernel comment's description. */
SG__HIDDEN const char *sg__cgen_cuda_rows(sg__cuda_gen *g, const sg__group *grp,
                                          sg__cuda_kinfo *ki);
/* The body of a MULTI group of full reductions (sg__group.sums), as
 * sg__cgen_cuda_rows does a row kernel's: with shuffles, every member's
 * range cut into chunks, a block per chunk, each block's partial in the
 * kernel's own device array and the last block to finish (a counter it
 * resets for the next launch) folding each member's partials in chunk
 * order, a warp per member, then the member's store and epilogue; without
 * them (OpenCL C), a work-group per member folding its chunks in order. */
SG__HIDDEN const char *sg__cgen_cuda_sums(sg__cuda_gen *g, const sg__group *grp,
                                          sg__cuda_kinfo *ki);
/* The same for the norm part of a MATMUL group with norm_rows: grp is that
 * part as a ROW group (members [0, its anchor), anchor at the norm), every
 * block computes every row (a warp per row up to 256 elements, else the
 * block), and member sink's value at walk index i goes to xs[i], an array
 * in shared memory of sink's dtype; nothing is launched by it. */
SG__HIDDEN void sg__cgen_cuda_rows_into(sg__cuda_gen *g, const sg__group *grp, int sink,
                                        const char *xs);
/* The argmax member am of a GEMV group over its `rows` rows, after the
 * GEMV's tail in the kernel's `grid` blocks: every thread holds
 * (am_b<r>, am_at<r>), its column's value and index or (-inf, -1); each
 * block's best per row goes to the kernel's static device arrays and the
 * last block to finish combines them and stores each row's index; am_last
 * (a shared bool, declared in the current scope) is true in that block. */
SG__HIDDEN void sg__cgen_cuda_gemv_argmax(sg__cuda_gen *g, const sg__group *grp, int am,
                                          int64_t rows, unsigned grid);
/* cgen_cuda.c's helpers. The walk index is `i` (flat, row-major over the
 * walk's shape) or i0..i<nd-1> after sg__cuda_unflatten. */
SG__HIDDEN sg__emit *sg__cuda_out(sg__cuda_gen *g);
SG__HIDDEN const sg__ir *sg__cuda_ir(const sg__cuda_gen *g);
SG__HIDDEN const sg__fused *sg__cuda_fused(const sg__cuda_gen *g);    /* a MULTI's parts */
SG__HIDDEN const sg__ref *sg__cuda_ref(const sg__cuda_gen *g, int r); /* after cse's alias */
SG__HIDDEN const sg__ref *sg__cuda_arg(const sg__cuda_gen *g, const sg__irnode *n, int j);
SG__HIDDEN void sg__cuda_widen(sg_dtype dt, const char *lv, char *buf, size_t size);
SG__HIDDEN void sg__cuda_narrow_store(sg_dtype dt, const char *lv, const char *v, char *buf,
                                      size_t size);
/* A float value rounded to dt and widened back, as a store and load would. */
SG__HIDDEN void sg__cuda_round_trip(const char *e, sg_dtype dt, char *buf, size_t size);
/* Can members [from, to) of grp (and extra, if not NULL) address their
 * refs by the flat index over shape? */
SG__HIDDEN bool sg__cuda_walk_flat(const sg__cuda_gen *g, const sg__group *grp, int from, int to,
                                   int nd, const int64_t *shape, const sg__ref *extra);
/* The element of r at element offset `off` (a C expression), as an lvalue. */
SG__HIDDEN void sg__cuda_lvalue_at(sg__cuda_gen *g, const sg__ref *r, const char *off,
                                   char *buf, size_t size);
/* The element of r at the walk index, as an lvalue. */
SG__HIDDEN void sg__cuda_lvalue(sg__cuda_gen *g, const sg__ref *r, int nd,
                                const int64_t *shape, bool flat, char *buf, size_t size);
/* Declare i0..i<nd-1> from i. */
SG__HIDDEN void sg__cuda_unflatten(sg__cuda_gen *g, int nd, const int64_t *shape);
/* Members [from, to) of grp at the walk index: v<k> for each, stored where
 * grp marks it; the anchor's value is read from v<anchor>. */
SG__HIDDEN void sg__cuda_members(sg__cuda_gen *g, const sg__group *grp, int from, int to, int nd,
                                 const int64_t *shape, bool flat);
/* Redirect what the helpers write to e; returns the previous output. */
SG__HIDDEN sg__emit *sg__cuda_set_out(sg__cuda_gen *g, sg__emit *e);
/*
 * Deferred stores, for a walk that takes n elements per lane at once: until
 * sg__cuda_defer_end, each store of value v<k> keeps v<k> in r_d<k>[r_u]
 * (its array declared once into `decl`) and its statement goes to `later`,
 * for a second walk of the same indices to replay after every load of the
 * n elements has issued. sg__cuda_store is that choice for one statement.
 */
SG__HIDDEN void sg__cuda_defer_begin(sg__cuda_gen *g, sg__emit *decl, sg__emit *later, int n);
SG__HIDDEN void sg__cuda_defer_end(sg__cuda_gen *g);
SG__HIDDEN void sg__cuda_store(sg__cuda_gen *g, bool fl, int k, const char *st);
/* What body(g, arg) emits, under `open` (a statement head such as
 * "if (blockIdx.x < 4)"), loading the bases of only the slots it names,
 * as a MULTI's member does (the kernel's head then loads none). */
SG__HIDDEN void sg__cuda_branch(sg__cuda_gen *g, const char *open,
                                void (*body)(sg__cuda_gen *, void *), void *arg);
/* sg__cuda_branch, but local slot `local` (when the body names it) takes
 * its base from the C expression `base` instead of slot[local]: one body
 * for several members whose inputs lie in different slots. */
SG__HIDDEN void sg__cuda_branch_based(sg__cuda_gen *g, const char *open,
                                      void (*body)(sg__cuda_gen *, void *), void *arg, int local,
                                      const char *base);
/* A constant table of n 64-bit integers in the kernel being emitted,
 * `name[n]`, in the dialect's spelling (sg__spell.table, which must be
 * set). */
SG__HIDDEN void sg__cuda_table(sg__cuda_gen *g, const char *name, const int64_t *v, int n);
/* int r_a: the last of rows 0 .. n - 1 of the ascending table `first` whose
 * value is at most the block's index (0 when none), found by bisection. */
SG__HIDDEN void sg__cuda_table_row(sg__cuda_gen *g, const char *first, int n);
/* The kernel's local index of IR slot `slot` (its s<n> and slot[n]). */
SG__HIDDEN int sg__cuda_local_slot(sg__cuda_gen *g, int slot);
/* The dialect's spellings of the kernel being emitted. */
SG__HIDDEN const sg__spell *sg__cuda_spell(const sg__cuda_gen *g);
/* An array the block shares, decl its type and declarator ("float r[8]"),
 * aligned to `align` bytes when not 0: where the kernel is at (CUDA), or at
 * its outermost scope (shared_top: OpenCL C allows __local nowhere else). */
SG__HIDDEN void sg__cuda_shared(sg__cuda_gen *g, int align, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/*
 * Without shuffles (OpenCL C): the nv (at most 4) values var[v] of type
 * type[v] ("float" or "sg_i64") combined over each 32 consecutive threads
 * through arrays at the kernel's outermost scope, as CUDA's xor shuffles by
 * 16, 8, .., 1 combine a warp's lanes -- the same operands in the same
 * order, so the same bits. `fold` is the statement that folds the values
 * other[v] into var[v]. warps == 1: every thread ends with its 32's
 * result; else the results of the block's `warps` 32s folded in order
 * (var = the first's, then each other's), as a block's shared words are.
 * Every thread of the block must reach it (it holds barriers).
 */
SG__HIDDEN void sg__cuda_tree(sg__cuda_gen *g, int nv, const char *const *type,
                              const char *const *var, const char *const *other, const char *fold,
                              int warps);

/* cgen_cuda.c's dialect, and the number under which the kernel being
 * emitted names IR slot s (its base is s<number>), for cgen_gemm.c. */
SG__HIDDEN sg__dialect sg__cuda_dialect(const sg__cuda_gen *g);
SG__HIDDEN int sg__cuda_slot(sg__cuda_gen *g, int s);

/*
 * The generated GEMM (cgen_gemm.c): a MATMUL group that no GEMV kernel
 * takes, as one tiled kernel computing the matmul/linear anchor (any
 * strides, broadcast batch dims, the bias), storing it and running the
 * epilogue on each element, f32 sums in a fixed order: on CUDA in f32 on
 * tensor cores (3xTF32 mma.sync, 64 x 64 or 32 x 32 tiles of 128 threads,
 * K split over blocks where the tiles leave SMs idle), else 64 x 64 tiles
 * of C per block of 256 threads, K in steps of 16 through shared memory.
 * sg__cgen_gemm writes the body into sg__cuda_out(g), sets ki's launch
 * and replaces_call and returns the kernel comment's description; NULL
 * (nothing written) when it does not take the group (a merged norm, pair
 * or cache copy, mixed dtypes, a strided output, an epilogue writing into
 * an operand, or a product the dialect leaves to its library).
 * sg__cgen_gemm_wanted: whether dialect d may generate its MATMUL groups:
 * OpenCL C (Level Zero has no BLAS library) and HIP (no hipBLASLt path)
 * all of them; CUDA its f32 products of at most 4M multiply-adds (on the
 * tensor-core kernel), or all of them with SG_CUDA_GEMM=generated (f32 on
 * the tensor-core kernel, f16/bf16 on the SIMT one) or =simt (all on the
 * SIMT kernel), else cuBLASLt runs them; =library: cuBLASLt all of them.
 */
SG__HIDDEN const char *sg__cgen_gemm(sg__cuda_gen *g, const sg__group *grp, sg__cuda_kinfo *ki);
SG__HIDDEN bool sg__cgen_gemm_wanted(sg__dialect d);

/*
 * Library anchors as generated code (cgen_serial.c), for a dialect with no
 * library kernel family (sg__cgen_serial_wanted: OpenCL C): a REDUCE or ROW
 * group that is not rows_inline (max, min, argmax, var, sum or mean over
 * any dims and dtypes, softmax/log_softmax over any dim, cross_entropy and
 * its gradient) or an OPAQUE arange, as one kernel of a work-item per
 * element of the anchor's output walking its inputs serially (float sums
 * compensated, in a fixed order), then the group's epilogue. Writes the
 * body into sg__cuda_out(g) and sets ki's launch and replaces_call; false
 * (nothing written) when it does not take the group.
 */
SG__HIDDEN bool sg__cgen_serial(sg__cuda_gen *g, const sg__group *grp, sg__cuda_kinfo *ki);
SG__HIDDEN bool sg__cgen_serial_wanted(sg__dialect d);
/*
 * The data ops CUDA's library kernels run (cgen_serial_data.c), for the
 * same dialects: an OPAQUE rand, topk, sample, gather or index_add as one
 * kernel computing what the CPU backend computes, bit for bit where the
 * CPU's result is defined by its order (Philox draws, tie order, index
 * order of sums). Writes the body into sg__cuda_out(g), sets ki's launch
 * and replaces_call and *what; false (nothing written) when it does not
 * take the group. sg__cgen_serial_data_prelude writes the helpers those
 * kernels call into a unit of dialect d whose IR needs them (after the
 * dialect's preamble).
 */
SG__HIDDEN bool sg__cgen_serial_data(sg__cuda_gen *g, const sg__group *grp, sg__cuda_kinfo *ki,
                                     const char **what);
SG__HIDDEN void sg__cgen_serial_data_prelude(sg__dialect d, const sg__ir *ir, sg__emit *e);

/* ------------------------------------------------------------ NVRTC (nvrtc.c) */

/*
 * Compile CUDA C source to a cubin for sm_<arch> (90 for the H100) with
 * NVRTC, loaded at run time (dlopen of libnvrtc), through the disk cache
 * (key: generator version, NVRTC version, options, arch, source). `name`
 * follows the rules of sg__cache_build_c; SG_DUMP_DIR and SG_OVERRIDE_DIR
 * work with <name>.cu. On success *cubin (sg__alloc'd, *size bytes; free
 * with sg__free) holds the image for cuModuleLoadData. Failures:
 * SG_ERR_COMPILE with the head of NVRTC's log, SG_ERR_BACKEND_UNAVAILABLE
 * when NVRTC cannot be loaded, SG_ERR_OOM.
 */
SG__HIDDEN sg_status sg__nvrtc_build(sg_ctx *ctx, const char *name, const char *source, int arch,
                                     void **cubin, size_t *size);
/* Process-wide count of NVRTC compiles (not cache hits), for tests. */
SG__HIDDEN uint64_t sg__nvrtc_compiles(void);

/* ------------------------------------------------------------ ocloc (ocloc.c) */

/* Built with AddressSanitizer or ThreadSanitizer: their runtimes abort the
 * process when a library is opened with RTLD_DEEPBIND, as libocloc and the
 * Level Zero GPU drivers do, so those stay unopened in such builds. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SG__SANITIZED 1
#else
#define SG__SANITIZED 0
#endif

/*
 * Compile OpenCL C source to a SPIR-V module with libocloc, loaded at run
 * time (dlopen of libocloc.so; oclocInvoke with the source in memory,
 * "-spv_only -device <SG_ZE_OCLOC_DEVICE, default pvc> -options
 * -cl-std=CL2.0": generated kernels take a pointer to pointers, which
 * OpenCL C 1.2 refuses in kernel parameters), through the disk
 * cache (entries spv-<key>.spv; key: generator version, ocloc's version,
 * options, source). The module is checked with spirv-val when it is on
 * PATH (without it, said once under "fallbacks", only the magic and the
 * length are checked). `name` follows the rules of sg__cache_build_c;
 * SG_DUMP_DIR and SG_OVERRIDE_DIR work with <name>.cl. On success *spirv
 * (sg__alloc'd, *size bytes) holds the module for zeModuleCreate.
 * Failures: SG_ERR_COMPILE with the head of ocloc's log (or spirv-val's),
 * SG_ERR_BACKEND_UNAVAILABLE when libocloc cannot be loaded (or in a
 * SG__SANITIZED build), SG_ERR_OOM.
 */
SG__HIDDEN sg_status sg__ocloc_build(sg_ctx *ctx, const char *name, const char *source,
                                     void **spirv, size_t *size);
/* The check every new module gets: SPIR-V's magic and a whole number of
 * words, then spirv-val (absent from PATH: said once under "fallbacks").
 * SG_OK or SG_ERR_COMPILE with the reason or spirv-val's output. */
SG__HIDDEN sg_status sg__ocloc_check(sg_ctx *ctx, const char *name, const void *spirv,
                                     size_t size);
/* Process-wide count of ocloc compiles (not cache hits), for tests. */
SG__HIDDEN uint64_t sg__ocloc_compiles(void);
/* Whether libocloc loads here (once per process): SG_OK, or
 * SG_ERR_BACKEND_UNAVAILABLE with the reason in why (tests skip on it). */
SG__HIDDEN sg_status sg__ocloc_probe(char *why, size_t n);

/* ------------------------------------------------------------ OpenCL C on the CPU (opencl.c) */

/*
 * Build an OpenCL C unit (sg__cgen_gpu's SG__DIALECT_OPENCL) with
 * clBuildProgram on the first OpenCL CPU device (PoCL), the ICD loader
 * libOpenCL.so.1 opened at run time: the check that the dialect compiles,
 * where its real targets are absent. SG_DUMP_DIR gets <name>.cl. On success
 * *program (when not NULL) is the cl_program, the caller's to release
 * (opencl.h has the API). Failures: SG_ERR_COMPILE with the head of the
 * build log, SG_ERR_BACKEND_UNAVAILABLE without a loader or CPU device.
 */
SG__HIDDEN sg_status sg__opencl_build(sg_ctx *ctx, const char *name, const char *source,
                                      void **program);

/* ------------------------------------------------------------ runtime compile drivers (nvrtc.c) */

/* The runtime compilers: NVRTC (CUDA) and hiprtc (HIP, AMD GPUs). */
typedef enum sg__rtc { SG__RTC_NVRTC, SG__RTC_HIPRTC } sg__rtc;

/*
 * sg__nvrtc_build generalized: compile `source` with driver drv for arch
 * ("sm_90" for NVRTC; "gfx90a" for hiprtc, which gets sg__hip_prelude
 * before the source), through the same disk cache (the key includes the
 * driver, its version and the arch). hiprtc is only asked for the archs
 * sg__hiprtc_arch_known accepts: any other is SG_ERR_BACKEND_UNAVAILABLE
 * naming it, without a call. On success *image (sg__alloc'd, *size bytes)
 * is the cubin or the code object for cuModuleLoadData/hipModuleLoadData.
 */
SG__HIDDEN sg_status sg__rtc_build(sg_ctx *ctx, sg__rtc drv, const char *name, const char *source,
                                   const char *arch, void **image, size_t *size);
/* Whether drv can be loaded (why not into why). */
/* n programs at once, each as sg__rtc_build compiles it (its own name, so
 * its own override, dump and cache entry), the ones the cache misses on up
 * to nthreads threads (the caller's among them); the first failure in
 * program order is the call's, and then no image is returned. */
SG__HIDDEN sg_status sg__rtc_build_many(sg_ctx *ctx, sg__rtc drv, int n, const char *const *names,
                                        const char *const *sources, const char *arch, int nthreads,
                                        void **cubins, size_t *sizes);
SG__HIDDEN bool sg__rtc_available(sg__rtc drv, char *why, size_t n);

/* A GPU unit (sg__cgen_gpu's text and kinfo) cut into parts that compile
 * apart: its emitted kernels dealt by size, largest first, each to the
 * lightest part; a part's source is the unit's text before its first
 * kernel followed by its kernels' text in unit order; at most
 * SG__MAX_PARTS parts. One part, the unit itself, when the unit holds less
 * than sg__unit_part_text() of kernel text a part, maxparts < 2, or
 * SG_DUMP_DIR or SG_OVERRIDE_DIR is set (both name the whole unit).
 * part[k]: the part of group k's kernel (a group running an earlier
 * group's kernel gets that group's part; 0 without a kernel). */
#define SG__PART_TEXT ((size_t)2 << 10)
#define SG__MAX_PARTS 16
/* The least kernel text a part gets: SG__PART_TEXT, or SG_NVRTC_PART_KB KB. */
SG__HIDDEN size_t sg__unit_part_text(void);
typedef struct sg__unit_parts {
    int n, ngroups;
    int *part;
    char *src[SG__MAX_PARTS];   /* part p's source (NUL-terminated) */
    size_t size[SG__MAX_PARTS]; /* bytes held for src[p]; 0 when it is the unit's own text */
    size_t text;  /* bytes of kernel text in the unit */
    int kernels;  /* emitted kernels */
} sg__unit_parts;
SG__HIDDEN sg_status sg__unit_split(sg_ctx *ctx, const char *src, const sg__cuda_kinfo *ki,
                                    int ngroups, int maxparts, sg__unit_parts *u);
SG__HIDDEN void sg__unit_parts_free(sg_ctx *ctx, sg__unit_parts *u);
/* The most parts a unit is cut into here: SG_NVRTC_THREADS, else the
 * machine's cores, at most SG__MAX_PARTS. */
SG__HIDDEN int sg__unit_max_parts(void);
/* Process-wide count of drv's compiles (not cache hits), for tests. */
SG__HIDDEN uint64_t sg__rtc_compiles(sg__rtc drv);
/* Whether hiprtc is asked to compile for this gfx arch (no feature suffix). */
SG__HIDDEN bool sg__hiprtc_arch_known(const char *arch);
/* What hiprtc compiles before a unit written for NVRTC: the CUDA spellings
 * HIP names otherwise (warp shuffles of width 32, __syncwarp). */
SG__HIDDEN extern const char sg__hip_prelude[];
/* The HIP runtime library (libamdhip64.so.6, .so.5, .so, or SG_HIP_RUNTIME),
 * opened once per process: its handle, or NULL with why it is not there
 * (naming the library and the fix). *path, when given, gets its name. */
SG__HIDDEN void *sg__hip_library(char *why, size_t n, const char **path);

#endif /* SG_CODEGEN_H */
