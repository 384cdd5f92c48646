/* The public header compiles as C and its defaults are usable from C. */
#include <stdio.h>

#include "voicestudio.h"

int main(void) {
    struct vs_context_params cp = vs_context_default_params();
    struct vs_synth_params   sp = vs_synth_default_params();
    (void) cp;
    (void) sp;
    printf("header ok: %d stages\n", VS_STAGE_COUNT);
    return 0;
}
