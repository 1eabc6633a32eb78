// The `lede` command line: parses the subcommand and hands over to lede::cli.
#include "services/cli/commands.h"

int main(int argc, char** argv) { return lede::cli::Main(argc, argv); }
