# Lets pytest find the skim_torch package beside tests/ without installing it.
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
