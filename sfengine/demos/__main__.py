import sys

from sfengine.demos.record import main

sys.exit(main())
