package main

import (
	"fmt"
	"math/big"

	"github.com/siphondb/siphon/canonical"
)

// Revenue is the replication logic under test: it keeps each customer's
// order total from the change stream of table shop.orders (customer text,
// total numeric), which runs with REPLICA IDENTITY FULL so updates and
// deletes carry the old row.
type Revenue struct {
	ByCustomer map[string]*big.Rat
}

// NewRevenue returns an empty Revenue.
func NewRevenue() *Revenue { return &Revenue{ByCustomer: map[string]*big.Rat{}} }

// Handle applies one change; it has the shape StreamChanges wants.
func (r *Revenue) Handle(ch canonical.Change) error {
	if ch.Schema != "shop" || ch.Table != "orders" {
		return nil
	}
	switch ch.Op {
	case canonical.OpInsert:
		return r.add(ch.Columns, ch.New, 1)
	case canonical.OpUpdate:
		if ch.Old == nil {
			return fmt.Errorf("update of shop.orders without the old row: set REPLICA IDENTITY FULL")
		}
		if err := r.add(ch.Columns, ch.Old, -1); err != nil {
			return err
		}
		return r.add(ch.Columns, ch.New, 1)
	case canonical.OpDelete:
		return r.add(ch.Columns, ch.Old, -1)
	case canonical.OpTruncate:
		r.ByCustomer = map[string]*big.Rat{}
	}
	return nil
}

// add adds sign × the row's total to its customer.
func (r *Revenue) add(cols []canonical.Column, row canonical.Row, sign int64) error {
	var customer, total string
	for i, col := range cols {
		text, _ := row[i].Text()
		switch col.Name {
		case "customer":
			customer = text
		case "total":
			total = text
		}
	}
	amount, ok := new(big.Rat).SetString(total) // numeric text is exact decimal
	if !ok {
		return fmt.Errorf("total %q is not a number", total)
	}
	sum := r.ByCustomer[customer]
	if sum == nil {
		sum = new(big.Rat)
		r.ByCustomer[customer] = sum
	}
	sum.Add(sum, amount.Mul(amount, big.NewRat(sign, 1)))
	return nil
}

// Total returns a customer's total as a decimal with two places.
func (r *Revenue) Total(customer string) string {
	if sum := r.ByCustomer[customer]; sum != nil {
		return sum.FloatString(2)
	}
	return "0.00"
}
