// Paths every test may use, included into each test file by the build (-include): the
// hyperion binary and the source tree. Defined in a file CMake generates, so that the
// test files' own compilation does not depend on where the tree is.
#pragma once

extern const char* const kHyperionTestCliPath;
extern const char* const kHyperionTestSourceDir;

#define HYPERION_CLI_PATH kHyperionTestCliPath
#define HYPERION_SOURCE_DIR kHyperionTestSourceDir
