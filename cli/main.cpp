// moe-ep: run, check and benchmark the MoE-EP layer (cli/commands.cpp).
#include "commands.h"

int main(int argc, char** argv) { return moe_ep::cli::run_main(argc, argv); }
