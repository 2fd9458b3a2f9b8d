/* The buggy quote (quote.h): in the service's executable, or in a shared
   library of its own (-DQUOTE_LIBRARY builds). */
#include "quote.h"

#ifdef __cplusplus
__attribute__((noinline)) long Pricing::quote(long item) const {
    volatile long rate = rate_;
    return item % 10 == 7 ? item * rate + 1 : item * rate;
}
#else
__attribute__((noinline)) long quote(long item) {
    volatile long rate = QUOTE_RATE;
    return item % 10 == 7 ? item * rate + 1 : item * rate;
}
#endif
