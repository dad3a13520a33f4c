// Whether two paths name the same file, by identity (device and inode), not by spelling:
// "./a/../a/x", a symlinked directory and a hard link all name the same file as "a/x".
// Commands that write outputs use it to refuse an output that is one of their inputs
// (a conversion written over its own source would destroy the source).
#pragma once

#include <string>
#include <vector>

namespace hyperion::io {

// True when both paths exist and are the same file (or directory).
bool same_file(const std::string& a, const std::string& b);

// Throws hyperion::Error when `output` is the same file as one of `inputs`, naming both
// and `what` (the command: "convert").
void check_output_is_not_an_input(const std::string& output, const std::vector<std::string>& inputs,
                                  const std::string& what);

// What identifies a file's version without reading it: its absolute path, size,
// modification time (ns) and inode, as one line. A file rewritten (even by a copy with the
// same name) gets a new one; only a deliberate reset of the modification time to the same
// nanosecond with the same size would not. Throws naming the path when it cannot stat it.
std::string file_fingerprint(const std::string& path);

// FNV-1a 64 of `text` as 16 hex digits: a short name for a key in a directory name.
std::string short_hash(const std::string& text);

}  // namespace hyperion::io
