/* The mixture-of-experts MLP of the fused layer stack (experts.c), for layer_stack.c. */
#ifndef TGI_EXPERTS_H
#define TGI_EXPERTS_H

#include "kernels.h"

/* act(gate) * up for M rows of gu ([M, 2 I]: gate, then up) into y [M, I] */
typedef void (*gate_fn)(const float* gu, float* y, int64_t M, int64_t I, int nthreads);

/* The scratch experts_mlp needs for M rows of H, experts of I_e: in floats */
int64_t experts_scratch_floats(const experts_t* ex, int64_t M, int64_t H);

/* out [M, H] = the experts' MLP of x [M, H]; scratch of experts_scratch_floats */
void experts_mlp(const experts_t* ex, const float* x, float* out, int64_t M, int64_t H, gate_fn gate,
                 float* scratch, int nthreads);

#endif
