"""The trainer integrations users import in their training scripts: ``hf``, ``lightning``,
``composer`` and ``trainer`` for any loop."""
