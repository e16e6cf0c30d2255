import sys

from filledfirst.cli import main

sys.exit(main())
