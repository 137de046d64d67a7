"""The studies' own commands, on top of the report (`posab.report`, which never imports this package):

- `claims`, `power`, `verdicts`, `readings`, `forest`: claims files, their power plan, their verdicts over
  a whole study, the generated readings and the forest plots (`posab claims`, `posab claims plan`);
- `tasks`: the algorithmic task suite (`posab tasks`);
- `needle`: the passkey stage's retrieval by length and stage curves (`posab needle-report`);
- `tuning`: the learning-rate pilot's picks (`posab tuning`);
- `budget`: the training budget's validation curves (`posab budget`);
- `window_documents`: each window's document added to a report folder's runs.csv (`posab
  window-documents`; reads the corpus, so it imports the data pipeline and torch).
"""
