import sys

from ironbatch.cli import main

sys.exit(main())
