/* The register-preservation target (regs_leaf.S): "check N" makes N calls of
 * the probed leaf and answers how many changed a register they should not
 * have (protocol: fixture_serve.h). */
#include "fixture_serve.h"

long rg_check(long calls);

static long answer(const char* name, long n) { return !strcmp(name, "check") ? rg_check(n) : -1L; }

int main(int argc, char** argv) { return fixture_serve(argc, argv, "regs_target", answer); }
