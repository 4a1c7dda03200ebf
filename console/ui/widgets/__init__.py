"""Widgets of the operator console, one concern per module."""
