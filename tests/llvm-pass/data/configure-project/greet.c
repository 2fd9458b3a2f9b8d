#include <stdio.h>
#include <string.h>

#include "greet.h"

int measure(const char* who) { return (int)strlen(who); }

void greet(const char* who) { printf("hello, %s (%d)\n", who, measure(who)); }
