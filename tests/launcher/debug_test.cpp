#include <gtest/gtest.h>

#include "redis_fixture.h"

using namespace iprobe::test;

TEST(LauncherDebug, Placeholder) { GTEST_SKIP() << "iprobe debug tests come with iprobe debug"; }
