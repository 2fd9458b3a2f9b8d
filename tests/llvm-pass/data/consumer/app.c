#include <iprobe/iprobe.h>
#include <stdio.h>

int twice(int x) {
    IPROBE_POINT_ARGS(consumer_twice, x);
    return 2 * x;
}

int main(void) {
    printf("%d\n", twice(21));
    return 0;
}
