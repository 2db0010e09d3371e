"""What each trial may run as, and how long each option would take."""
