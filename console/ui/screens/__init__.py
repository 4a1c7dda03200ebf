"""The console's screens: Fleet and Jobs views, and the modals they open."""
