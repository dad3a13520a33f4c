// Opening a file hyperion reads from a path a user gave (a model directory's files, a
// tokenizer, a chat template, a hostfile, data): never blocking and never anything but a
// regular file. open() of a FIFO with no writer blocks forever, and reading a device
// (/dev/zero, /dev/urandom) never ends; a directory is not data. So the file is opened
// with O_NONBLOCK, checked to be a regular file, and only then read (in blocking mode);
// anything else is refused with an error naming the path and what it is ("is a FIFO").
#pragma once

#include <cstdint>
#include <string>

namespace hyperion {

// "a FIFO", "a directory", "a character device", ... for st_mode (what errors say).
const char* file_kind_name(unsigned mode);

// Opens `path` read-only (O_CLOEXEC) as above and returns the descriptor, blocking again;
// *size gets its size in bytes. Throws hyperion::Error "cannot read '<path>': <why>".
int open_regular_file(const std::string& path, int64_t* size);

// The whole of such a file, of at most max_bytes (also when it grows while read). Throws
// naming the path and the size.
std::string read_regular_file(const std::string& path, int64_t max_bytes);

// The same check for a reader that opens the file itself (a third-party library): throws
// unless `path` (followed through symbolic links) is a regular file.
void check_regular_file(const std::string& path);

}  // namespace hyperion
