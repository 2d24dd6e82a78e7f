"""The six panels of the main window."""
