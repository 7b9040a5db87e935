"""biLMs on disk: this package's directory, bilm-tf's format, ELMoForManyLangs'
folders, serving exports, and `load_bilm`'s table of them (`locate`)."""
