"""Quality against communication on the example LM: the main study and what it reads."""
