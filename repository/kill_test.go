package repository_test

const childMode = "SIPHON_REPOSITORY_CHILD"

func runChild() int { return 2 }
