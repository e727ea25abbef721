
tokenize me</s>