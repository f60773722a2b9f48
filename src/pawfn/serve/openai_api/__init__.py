"""The OpenAI-compatible API of `pawfn serve`: its shapes (`protocol`), its routes (`routes`) and its error object (`errors`)."""
