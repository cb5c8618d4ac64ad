"""CLI: python3 tests/networld {up|down|status|check|env}  (as root)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from networld.cli import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
