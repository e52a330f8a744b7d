// The `moe-ep` command's entry point, callable in-process (the unit tests drive it this way,
// so the sanitizer build checks the very code the command runs).
#pragma once

#include <string>
#include <vector>

namespace moe_ep::cli {

// Parses the arguments and runs the command. Returns the exit status (0 success, 1 a result
// outside its tolerance, 2 a usage error printed as usage); throws moe_ep::Error for a bad
// argument or input, which main() prints as "moe-ep: error: ..." with exit status 2.
int main_impl(int argc, char** argv);
int main_impl(const std::vector<std::string>& args);  // args[0] is the program name

// main()'s handler: runs main_impl, turns exceptions (out of memory included) into a message
// on stderr and exit status 2.
int run_main(int argc, char** argv);

}  // namespace moe_ep::cli
