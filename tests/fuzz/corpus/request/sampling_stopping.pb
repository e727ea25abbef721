
req-1.a:b_cThe </s> king said"333?(%fff?-š™™?0** 

The end (è2