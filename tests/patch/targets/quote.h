/* The function `iprobe patch` replaces in the tests: a price quote for an
   item number, with a deliberate bug in quote.c (items ending in 7 are
   quoted one too high), fixed in quote_fix.c. */
#ifndef PATCH_QUOTE_H
#define PATCH_QUOTE_H

#ifdef __cplusplus
/* The C++ build: the quote is a member function. */
class Pricing {
public:
    explicit Pricing(long rate) : rate_(rate) {}
    long quote(long item) const;

private:
    long rate_;
};
#elif !defined(WRONG_SIGNATURE)
long quote(long item);
#endif

#define QUOTE_RATE 3
#define QUOTE_FIXED(item) ((item) * QUOTE_RATE)
#define QUOTE_BUGGY(item) ((item) % 10 == 7 ? (item) * QUOTE_RATE + 1 : (item) * QUOTE_RATE)

#endif
