/* The fix, built as a shared object for `iprobe patch --with`: the same
   function, and a second name for it (SYMBOL of --with LIB.so:SYMBOL). */
#include "quote.h"

#ifdef __cplusplus
long Pricing::quote(long item) const {
    volatile long rate = rate_;
    return item * rate;
}
#elif defined(WRONG_SIGNATURE)
int quote(int item, int rate) { return item * rate; }
#else
long quote(long item) {
    volatile long rate = QUOTE_RATE;
    return item * rate;
}
long quote_v2(long item) { return quote(item); }
/* For a second patch in the same command: main is never called again, so
   replacing it changes nothing the service does. */
int main_v2(int argc, char** argv) { return argv ? argc : 0; }
#endif
