/*
 * stubs.c -- a kernel family whose source file is not in this tree yet
 * (CMake defines SG_HAVE_CU_<FAMILY> for each graphs/cuda/cuda_<family>.c
 * it finds) answers SG_ERR_UNSUPPORTED instead of leaving the executor
 * with an undefined symbol. With every family present this file is empty.
 */
#include "exec.h"

#ifdef SG_HAVE_CUDA_HEADERS

#define SG__CU_STUB(fn, fam)                                                                       \
    sg_status fn(sg_ctx *ctx, const sg__node *n) {                                                 \
        return sg__fail(ctx, SG_ERR_UNSUPPORTED,                                                   \
                        "cuda: %s has no CUDA kernel in this build (the " fam                      \
                        " family is missing); use SG_BACKEND_CPU",                                 \
                        sg__op_name(n->op));                                                       \
    }

#ifndef SG_HAVE_CU_POINTWISE
SG__CU_STUB(sg__cuda_pointwise, "pointwise")
#endif
#ifndef SG_HAVE_CU_DATA
SG__CU_STUB(sg__cuda_data, "data")
#endif
#ifndef SG_HAVE_CU_REDUCE
SG__CU_STUB(sg__cuda_reduce, "reduce")
#endif
#ifndef SG_HAVE_CU_ROW
SG__CU_STUB(sg__cuda_row, "row")
#endif
#ifndef SG_HAVE_CU_MATMUL
SG__CU_STUB(sg__cuda_matmul, "matmul")
void sg__cublaslt_release(sg_ctx *ctx) { (void)ctx; }
#endif

#endif /* SG_HAVE_CUDA_HEADERS */

/* ISO C wants at least one declaration in a translation unit. */
typedef int sg__cuda_stubs_unused;
