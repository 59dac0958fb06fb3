"""The paper's regime: its variants one by one, its protocol whole, its claims over many rounds."""
