"""Harnesses for checking compactrl against the real thing (not used by training or evaluation).

Each module here compares a fast component with the reference it stands in for (the sim sandbox
against real backends, the sim shell against real bash) over a corpus, and reports agreement.
Tests and ``benchmarks/`` call them; nothing in the library imports them.
"""
