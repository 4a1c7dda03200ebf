"""What runs on the operator's machine: inventory, transports, the fleet controller and the TUI."""

import warnings

# asyncssh names DSA key classes at import; cryptography 51 deprecates DSA and warns there, on
# every command's stderr. Nothing an operator can act on (hotspare never makes or asks for a
# DSA key), and a command's error must stay one line: that one warning is not shown.
warnings.filterwarnings("ignore", message="DSA is deprecated", module="asyncssh")
