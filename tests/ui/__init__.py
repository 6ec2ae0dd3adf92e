"""The dashboard: routes over real HTTP, and in a real headless Chromium."""
