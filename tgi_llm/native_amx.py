"""AMX tile setup for the C kernels, as one C preamble the kernel sources include after VECTORS_C.

Intel's AMX (Xeon from Sapphire Rapids on) multiplies bfloat16 tiles (16 rows x 64 bytes) on a unit of
its own. Linux hands a process the tiles' register state only when asked (arch_prctl, 5.16+), once per
process; each thread then loads a tile configuration before its first tile instruction and releases the
tiles when done, so that a context switch does not save 8 KB of their state. HAVE_AMX is defined only
where -march=native has AMX-BF16 and AVX512-BF16 (the split and pair conversions use the latter), so
other CPUs never see an AMX instruction.
"""

AMX_C = r"""
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
"""
