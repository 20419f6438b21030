/*
 * cpu_reduce.c -- eager CPU kernels of the reduce family (being written).
 */
#include "cpu.h"

sg_status sg__cpu_reduce(sg_ctx *ctx, const sg__node *n) {
    return sg__fail(ctx, SG_ERR_UNSUPPORTED, "cpu: %s has no CPU kernel yet", sg__op_name(n->op));
}
