#pragma once
int measure(const char* who);
void greet(const char* who);
