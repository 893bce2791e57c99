"""The top of odqa: the `odqa` command and the end-to-end demo. Imports retriever/, reader/, common/."""
