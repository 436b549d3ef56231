"""What the test modules share: the one ``wait_for``, the repository's files, fakes and fixtures' machinery.

Test modules import from here and from the packages under test, never from one another.
"""
