/*
 * backend.h -- the one place that names devices. Each backend provides an
 * init function that checks its driver and device and fills the context's
 * executor (capture.h: sg__exec); sg_ctx_create tries them in order.
 * Later layers add graph build/instantiate/replay/patch slots here.
 */
#ifndef SG_BACKEND_H
#define SG_BACKEND_H

#include "../capture/capture.h"

/* Fill ctx->exec for the CPU. Never unavailable; fails only on OOM. */
SG__HIDDEN sg_status sg__cpu_init(sg_ctx *ctx);

#endif /* SG_BACKEND_H */
