/* AMX tile setup for the C kernels.

   Intel's AMX (Xeon from Sapphire Rapids on) multiplies bfloat16 tiles (16 rows x 64 bytes) on a unit of
   its own. Linux hands a process the tiles' register state only when asked (arch_prctl, 5.16+), once per
   process; each thread then loads a tile configuration before its first tile instruction and releases the
   tiles when done, so that a context switch does not save 8 KB of their state. HAVE_AMX is defined only
   where -march=native has AMX-BF16 and AVX512-BF16 (the split and pair conversions use the latter), so
   other CPUs never see an AMX instruction. `pair_words`, the k-pair conversion both the tiles and VDPBF16PS
   read, comes with it wherever AVX512-BF16 is. */
#ifndef TGI_AMX_H
#define TGI_AMX_H

#include "vectors.h"

#if defined(__AVX512BF16__) && VL == 16
/* Word n: bf16(e[n]) | bf16(o[n]) << 16, rounded to nearest even (VCVTNE2PS2BF16, which also flushes denormals,
   as the tile unit does anyway): the k-pair layout of TDPBF16PS's B operand and of VDPBF16PS's operands */
static inline __m512i pair_words(const __m512 e, const __m512 o) {
    const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                                23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutexvar_epi16(interleave, (__m512i)_mm512_cvtne2ps_pbh(o, e));
}
#endif

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && VL == 16
#define HAVE_AMX 1
#include <sys/syscall.h>
#include <unistd.h>

/* Whether the kernel granted this process the tiles' state: asked once, the answer kept. */
static int amx_granted(void) {
    static int state = -1; /* -1 not asked yet */
    if (state < 0) {
        const long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
        state = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    }
    return state;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) tilecfg_t;

/* This thread's tiles, all eight 16 rows x 64 bytes; _tile_release() when done */
static void amx_configure(void) {
    tilecfg_t c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 8; i++) { c.colsb[i] = 64; c.rows[i] = 16; }
    _tile_loadconfig(&c);
}
#endif

#endif /* TGI_AMX_H */
