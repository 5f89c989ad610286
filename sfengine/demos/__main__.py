import sys

from sfengine.config import check_command_line
from sfengine.demos.options import demos_parser

# --help and a misspelt option are answered from the option names, before the recording imports the engine.
check_command_line(sys.argv[1:], "sfengine.demos", demos_parser())

from sfengine.demos.record import main  # noqa: E402

sys.exit(main())
