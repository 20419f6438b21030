/*
 * cpu_matmul.c -- eager CPU kernels of the matmul family (being written).
 */
#include "cpu.h"

sg_status sg__cpu_matmul(sg_ctx *ctx, const sg__node *n) {
    return sg__fail(ctx, SG_ERR_UNSUPPORTED, "cpu: %s has no CPU kernel yet", sg__op_name(n->op));
}
