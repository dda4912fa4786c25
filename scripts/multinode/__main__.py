import sys

from multinode.cli import main

sys.exit(main())
